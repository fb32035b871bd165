"""Validation: every token and error of a shard store checked and counted."""
