"""The chat dataset: building the shipped corpus, reading and tokenizing conversations."""
