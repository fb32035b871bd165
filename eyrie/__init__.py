"""Eyrie: from a served target LLM to a trained, validated EAGLE-3 drafter."""

__version__ = "0.1.0"
