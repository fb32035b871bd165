"""Reading a Hugging Face config.json that may wrap its language model.

Multimodal wrappers (Kimi-K2.5, Llava-style) keep the language model's keys under
`text_config`; plain models keep them at the top. Every stage that reads a size or a layer
count from config.json goes through `text_config`, so a wrapper is handled in one place.
"""

from __future__ import annotations


def text_config(config: dict) -> dict:
    """The language model's keys of a config.json dict (`text_config` when it has one)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) and inner else config
