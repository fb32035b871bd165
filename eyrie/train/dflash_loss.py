"""What DFlash is trained on: anchors, each block slot's label, and the per-slot sums.

A block anchored at position a holds x_a and B-1 mask tokens. Slot k (1..B-1) is scored against
the target's greedy token at position a+k, which the store holds as the argmax of the target's
head over final_hidden[a+k-1], when token a+k is a loss-mask (answer) token. Slot 0 is x_a
itself and is never scored. An anchor is eligible when x_a and x_{a+1} are answer tokens and a
context row comes before it: at serving, every verified answer token starts a block.

The sums come per slot, as the EAGLE-3 unroll's come per step (eyrie/train/loss.py): slot k+1
fills column k, and the loop weighs column k by step_weight ** k (exp(-k / gamma)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eyrie.target.greedy import greedy_tokens
from eyrie.train.dflash import draft_logits
from eyrie.train.loss import autocast


def eligible(loss_mask: torch.Tensor) -> torch.Tensor:
    """(b, T) bool: positions that may anchor a block."""
    ok = torch.zeros_like(loss_mask, dtype=torch.bool)
    ok[:, 1:-1] = loss_mask[:, 1:-1].bool() & loss_mask[:, 2:].bool()
    return ok


def sample_anchors(ok: torch.Tensor, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """Up to ``n`` eligible anchors per row, drawn without replacement, ascending; -1 pads."""
    scores = torch.rand(ok.shape, generator=generator).to(ok.device)
    scores = scores.masked_fill(~ok, -1.0)
    n = min(n, ok.shape[1])
    top, idx = scores.topk(n, dim=1)
    idx = idx.masked_fill(top < 0, ok.shape[1])  # past the end: sorted last, then -1
    idx = idx.sort(dim=1).values
    return idx.masked_fill(idx >= ok.shape[1], -1)


def every_anchor(ok: torch.Tensor) -> torch.Tensor:
    """All eligible anchors of each row, ascending; -1 pads rows with fewer."""
    n = int(ok.sum(1).max()) if ok.numel() else 0
    pos = torch.arange(ok.shape[1], device=ok.device).expand_as(ok)
    key = torch.where(ok, pos, ok.shape[1])
    idx = key.sort(dim=1).values[:, : max(n, 1)]
    return idx.masked_fill(idx >= ok.shape[1], -1)


def slot_labels(greedy, loss_mask, anchors, block_size: int) -> tuple:
    """(label, scored), each (b, N, B-1): slot k+1's target token and whether it counts."""
    T = greedy.shape[1]
    at = anchors[..., None] + torch.arange(1, block_size, device=anchors.device)  # a+k
    inside = (anchors[..., None] >= 0) & (at < T)
    at_c = at.clamp(0, T - 1)
    label = greedy.gather(1, (at_c - 1).clamp(min=0).flatten(1)).view(at.shape)
    scored = inside & loss_mask.bool().gather(1, at_c.flatten(1)).view(at.shape)
    return label, scored


def shared_inputs(model, head, batch: dict, dtype) -> dict:
    """What every anchor set of one batch shares: the target's greedy tokens (the labels) and
    the drafter's context keys. Held-out scoring draws many anchor sets from one batch."""
    with autocast(batch, dtype):
        ctx_kv = model.context_kv(batch["aux_hidden"])
    return {"greedy": greedy_tokens(batch["final_hidden"], head.lm_head), "ctx_kv": ctx_kv}


def block_terms(model, head, batch: dict, anchors: torch.Tensor, dtype, shared=None) -> dict:
    """Per-slot sums of one batch at ``anchors``: ce, correct, chain, chain_starts, counts.
    ``shared``: shared_inputs() of the batch (under no_grad only: its keys carry no graph)."""
    greedy = shared["greedy"] if shared else greedy_tokens(batch["final_hidden"], head.lm_head)
    ctx_kv = shared["ctx_kv"] if shared else None
    B = model.config.block_size
    with autocast(batch, dtype):
        hidden = model(batch["aux_hidden"], batch["input_ids"], anchors, head.embed, ctx_kv)
    logits = draft_logits(hidden, head.lm_head).float()
    label, scored = slot_labels(greedy, batch["loss_mask"], anchors, B)
    ce = F.cross_entropy(logits.flatten(0, -2), label.flatten(), reduction="none")
    ce = ce.view(label.shape) * scored
    hit = (logits.argmax(-1) == label) & scored
    run = hit.long().cumprod(-1).bool()  # slots 1..k+1 all right: a chain of k+1 drafts accepted
    return {
        "ce": ce.sum((0, 1)),
        "correct": hit.sum((0, 1)).double(),
        "chain": run.sum((0, 1)).double(),
        "chain_starts": scored[..., 0].sum().double(),
        "counts": scored.sum((0, 1)).double(),
        "accepted": run.sum(-1),  # per anchor: drafts a greedy verifier would accept
    }
