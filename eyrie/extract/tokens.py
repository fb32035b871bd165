"""A shard's members tokenized: what extraction runs through the target, and what it cannot."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eyrie.data.chat_tokens import SampleError, tokenize_chat
from eyrie.data.split import Record


@dataclass
class TokenizedSample:
    """A split line whose conversation tokenized: what extraction runs through the target."""

    line: int
    sample_id: str
    input_ids: np.ndarray
    loss_mask: np.ndarray
    full_length: int = 0  # tokens before the cut at dataset.max_tokens


def tokenize(
    tokenizer, members: list[Record], max_tokens: int
) -> tuple[list[TokenizedSample], dict]:
    """The members that tokenize cleanly, and line -> (sample_id, reason, detail) of the rest."""
    good, errors = [], {}
    for rec in members:
        if rec.error:
            errors[rec.line] = (rec.sample_id, *rec.error)
            continue
        try:
            t = tokenize_chat(tokenizer, rec.messages, max_tokens)
        except SampleError as exc:
            errors[rec.line] = (rec.sample_id, exc.reason, exc.detail)
            continue
        good.append(
            TokenizedSample(rec.line, rec.sample_id, t.input_ids, t.loss_mask, t.full_length)
        )
    return good, errors
