"""The shipped small targets: a trained toy-llama and a seeded toy-deepseek (MLA + MoE)."""
