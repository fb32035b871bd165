"""Pieces every stage shares: errors, atomic writes, config and its schema, disk checks."""
