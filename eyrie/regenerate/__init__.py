"""Regeneration: the target answers the dataset's prompts itself, turn by turn.

A drafter learns to predict the target's next token; trained on text the target would not have
written, it learns another model's habits. This stage replaces every assistant turn by the
target's own answer, and answers the user turns that have none (prompts-only data such as
MT-bench questions), each against its own earlier answers, before extraction. Held-out prompts
are regenerated on their own, so they stay held out.
"""
