"""Real speculative decoding with a transformers target and the trained drafter (greedy, chain).

Each step the drafter proposes k tokens; the target reads the last accepted token and the k
drafts in one forward pass over its KV cache, accepts the longest prefix of drafts that equal
its own greedy choices, and adds one token of its own (the bonus: the correction after the
first wrong draft, or the next token when every draft is right). The rejected drafts' entries
are cropped from the target's cache. The output is therefore the target's plain greedy output,
token for token, whatever the drafter proposes; only the number of target passes changes.

The target (eyrie.evaluate.target_runner) and the drafter (eyrie.evaluate.draft_runner, or
DFlash's eyrie.evaluate.block_runner) each keep their own cache; eyrie.evaluate.tree drafts a
tree instead of a chain, and eyrie.evaluate.loading loads the pair and the prompts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from eyrie.evaluate.draft_runner import DraftRunner
from eyrie.evaluate.target_runner import SpeculateError, Target, cache_length, crop_cache


@dataclass
class Generation:
    tokens: list[int]  # the new tokens (of every turn, in order)
    seconds: float
    accepted: list[int] = field(default_factory=list)  # drafts accepted per verify step
    turns: list[int] = field(default_factory=list)  # new tokens per turn; empty: one turn
    # plain greedy only: the target's top-1 minus top-2 logit at each new token. Where a
    # speculative output parts from greedy, this says whether the target nearly tied there
    # (in bf16 a multi-token verify pass and a one-token step round differently)
    margins: list[float] = field(default_factory=list)

    @property
    def verify_steps(self) -> int:
        return len(self.accepted)

    @property
    def turn_tokens(self) -> list[int]:
        """New tokens per turn decoded (each turn's first comes from its prefill)."""
        return self.turns or [len(self.tokens)]


def sync_device(device: torch.device) -> None:
    """Wait for the GPU's queued kernels, so the clock read next counts them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cut_output(tokens: list[int], max_new: int, eos: set[int]) -> tuple[list[int], bool]:
    """Tokens cut after the first eos and at max_new; and whether generation is over."""
    for i, t in enumerate(tokens[:max_new]):
        if t in eos:
            return tokens[: i + 1], True
    return tokens[:max_new], len(tokens) >= max_new


def _prefill(target: Target, prompt: list[int]):
    """Start the clock and run the prompt into a new cache: (t0, cache, [first token], aux,
    the first token's logits)."""
    sync_device(target.device)
    t0 = time.perf_counter()
    cache = target.new_cache()
    logits, aux = target.forward(prompt, cache)
    return t0, cache, [int(logits[-1].argmax())], aux, logits[-1]


def top_margin(logits: torch.Tensor) -> float:
    """The top-1 minus the top-2 logit of one row."""
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


def greedy_generate(target: Target, prompt: list[int], max_new_tokens: int, eos=()) -> Generation:
    """Plain greedy decoding, one target pass per token over the same KV cache code path."""
    eos = set(eos)
    t0, cache, out, _, first = _prefill(target, prompt)
    rows = [first.clone()]  # each token's logits, for its margin once the clock has stopped
    out, done = cut_output(out, max_new_tokens, eos)
    while not done:
        logits, _ = target.forward([out[-1]], cache)
        rows.append(logits[-1])
        out, done = cut_output(out + [int(logits[-1].argmax())], max_new_tokens, eos)
    sync_device(target.device)
    seconds = time.perf_counter() - t0
    return Generation(out, seconds, margins=[top_margin(r) for r in rows[: len(out)]])


def start_speculation(target: Target, drafter: DraftRunner, prompt, max_new_tokens: int, eos):
    """The prompt through the target and the drafter: (t0, cache, [first token], eos set,
    whether generation is already over)."""
    if not prompt:
        raise SpeculateError("an empty prompt cannot be decoded")
    eos = set(eos)
    t0, cache, out, aux, _ = _prefill(target, prompt)
    drafter.reset()
    drafter.extend(aux, prompt[1:] + out, 0)
    out, done = cut_output(out, max_new_tokens, eos)
    return t0, cache, out, eos, done


def speculative_generate(
    target: Target, drafter: DraftRunner, prompt: list[int], k: int, max_new_tokens: int, eos=()
) -> Generation:
    """Greedy chain speculative decoding with k drafts per step; the output equals greedy's."""
    if k < 1:
        raise SpeculateError(f"evaluate.draft_tokens must be at least 1, got {k}")
    t0, cache, out, eos, done = start_speculation(target, drafter, prompt, max_new_tokens, eos)
    accepted: list[int] = []
    while not done:
        n = cache_length(cache)  # positions the target has seen; out[-1] sits at position n
        drafts = drafter.propose(k)
        logits, aux = target.forward([out[-1]] + drafts, cache)
        choice = logits.argmax(-1).tolist()  # choice[j]: the target's token after input j
        a = 0
        while a < k and drafts[a] == choice[a]:
            a += 1
        new = drafts[:a] + [choice[a]]
        crop_cache(cache, n + a + 1)
        drafter.extend(aux[:, : a + 1], new, n)
        accepted.append(a)
        out, done = cut_output(out + new, max_new_tokens, eos)
    sync_device(target.device)
    return Generation(out, time.perf_counter() - t0, accepted)
