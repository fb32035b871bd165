"""Batched generation with transformers: left-padded prompts, a KV cache, stop at end of turn.

`HFGenerator.generate` answers a list of token-id prompts with transformers' own `generate`
(greedy at temperature 0, else sampling), a batch at a time, prompts sorted by length so little
padding is spent. The answer stops at the first end-of-turn id (the tokenizer's eos and the
generation config's) and reports whether it stopped there or at `max_new_tokens`. While a batch
decodes, `on_tokens(n)` (when set) hears of each step's new tokens, so a progress bar moves
token by token rather than once per batch (a batch of long answers takes minutes on a CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers.generation.streamers import BaseStreamer


@dataclass
class Answer:
    ids: list[int]  # the new tokens, without the stop token
    stopped: bool  # True: ended by an end-of-turn id; False: cut at max_new_tokens
    failed: bool = False  # the request was lost (a server backend, after its retries)


def stop_ids(tokenizer, model) -> list[int]:
    """End-of-turn ids: the tokenizer's eos and those of the model's generation config."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    ids |= set(extra if isinstance(extra, list | tuple) else [extra])
    return sorted(i for i in ids if i is not None)


class _TokenCounter(BaseStreamer):
    """transformers' streamer hook: the prompt first, then one token per row and step; counts
    the tokens of the rows still answering (a finished row is padded, not decoded)."""

    def __init__(self, rows: int, stops: list[int], on_tokens: Callable[[int], None]):
        self.live = [True] * rows
        self.stops, self.on_tokens = set(stops), on_tokens
        self.prompt_seen = False

    def put(self, value) -> None:
        if not self.prompt_seen:  # generate() streams the prompt ids first
            self.prompt_seen = True
            return
        n = 0
        for row, token in enumerate(value.reshape(-1).tolist()):
            if self.live[row]:
                n += 1
                self.live[row] = token not in self.stops
        if n:
            self.on_tokens(n)

    def end(self) -> None:
        pass


class HFGenerator:
    """The target, in-process, answering prompts in batches."""

    on_tokens: Callable[[int], None] | None = None  # set by the stage for its progress bar

    def __init__(
        self, model, tokenizer, *, max_new_tokens: int, temperature: float, batch_size: int
    ):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature = int(max_new_tokens), float(temperature)
        self.batch_size = int(batch_size)
        self.stops = stop_ids(tokenizer, model)
        pad = tokenizer.pad_token_id
        self.pad = pad if pad is not None else self.stops[0]
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def generate(self, prompts: list[list[int]]) -> list[Answer]:
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[Answer | None] = [None] * len(prompts)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            for i, answer in zip(idx, self._batch([prompts[i] for i in idx]), strict=True):
                out[i] = answer
        return out  # type: ignore[return-value]

    def _batch(self, prompts: list[list[int]]) -> list[Answer]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):  # left padding: every prompt ends at the same column
            ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[row, width - len(p) :] = 1
        sample = self.temperature > 0
        streamer = None
        if self.on_tokens is not None:
            streamer = _TokenCounter(len(prompts), self.stops, self.on_tokens)
        seq = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            max_new_tokens=self.max_new_tokens,
            do_sample=sample,
            temperature=self.temperature if sample else None,
            top_p=1.0 if sample else None,
            top_k=0 if sample else None,
            pad_token_id=self.pad,
            eos_token_id=self.stops,
            streamer=streamer,
        )
        answers = []
        for row in seq[:, width:].tolist():
            cut = next((j for j, t in enumerate(row) if t in self.stops), None)
            answers.append(Answer(row if cut is None else row[:cut], cut is not None))
        return answers
