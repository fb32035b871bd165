"""The shipped small targets: a trained toy-llama, a seeded toy-deepseek (MLA + MoE) and
toy-kimi-k25 (Kimi-K2.5's multimodal wrapper around toy-deepseek's language model)."""
