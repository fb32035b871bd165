"""Extraction: one shard job over a capture (transformers in-process, or an SGLang server)."""
