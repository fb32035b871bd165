"""Export: the trained drafter in SGLang and vLLM form, and the check engines rely on."""
