"""Evaluation: offline acceptance, baselines, speculative decoding, online SGLang, report."""
