"""The training objective of the unroll: per-step losses and accuracies, aligned as in serving.

Row t at unroll step k feeds token x_{t+k+1} and is scored against the target at position
t+k+1 (its distribution p and greedy token over the full vocabulary) when token t+k+2 is a
loss-mask token; eyrie/train/model.py draws the alignment.

Two losses (``train.loss``):

- ``soft``: cross-entropy -sum_v p(v) log q(v) against the target's distribution restricted to
  the draft vocabulary and renormalized (EAGLE-3's, the same gradient as KL(p || q)).
- ``greedy``: cross-entropy against the target's greedy token alone, on rows whose greedy token
  is in the draft vocabulary. Acceptance under greedy verification only asks the draft's argmax
  to be the target's; a small drafter on a small budget reaches that sooner when it is not also
  asked to copy the shape of a high-entropy distribution (benchmarks/RESULTS.md measures both).
"""

from __future__ import annotations

import torch

LOSSES = ("soft", "greedy")


def soft_cross_entropy(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """-sum_v p(v) log q(v) per row, q = softmax(logits); fp32."""
    return -(target_probs * torch.log_softmax(logits.float(), dim=-1)).sum(-1)


def greedy_cross_entropy(logits: torch.Tensor, label: torch.Tensor, valid: torch.Tensor):
    """-log q(label) per row where ``valid``, 0 elsewhere; fp32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    picked = logp.gather(-1, label.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -(picked * valid)


def draft_index(greedy: torch.Tensor, d2t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft id of each target id, whether it has one); draft ids ascend with target ids."""
    draft_tokens = d2t + torch.arange(len(d2t), device=d2t.device)
    idx = torch.searchsorted(draft_tokens, greedy).clamp(max=len(d2t) - 1)
    return idx, draft_tokens[idx] == greedy


def scored_rows(k: int, T: int) -> int:
    """Rows of step k that can be scored: row t needs token t+k+2, so t <= T-k-3."""
    return max(0, T - k - 2)


def step_counts(loss_mask: torch.Tensor, steps: int) -> torch.Tensor:
    """Scored positions per unroll step, (steps,): known before the forward pass."""
    T = loss_mask.shape[1]
    return torch.stack(
        [loss_mask[:, k + 2 : k + 2 + scored_rows(k, T)].sum() for k in range(steps)]
    ).to(torch.float64)


def ttt_terms(logits: list, probs, greedy, loss_mask, d2t, loss: str = "soft") -> dict:
    """Per-step sums over this batch: loss, correct drafts, correct chains (all steps <= k).

    Row t at step k is scored against the target at position t+k+1 (probs, greedy) when token
    t+k+2 is a loss-mask token; see eyrie/train/model.py for the diagram.
    """
    if loss not in LOSSES:
        raise ValueError(f"train.loss {loss!r} is not one of {LOSSES}")
    T = loss_mask.shape[1]
    ce, correct, chain = [], [], []
    alive = loss_mask[:, 2:]  # rows whose step-0 draft is scored: the start of a chain
    label, in_vocab = draft_index(greedy, d2t) if loss == "greedy" else (None, None)
    for k, lg in enumerate(logits):
        n = scored_rows(k, T)
        m = loss_mask[:, k + 2 : k + 2 + n]
        if loss == "soft":
            per_row = soft_cross_entropy(lg[:, :n], probs[:, k + 1 : k + 1 + n])
        else:
            sl = slice(k + 1, k + 1 + n)
            per_row = greedy_cross_entropy(lg[:, :n], label[:, sl], in_vocab[:, sl])
        ce.append((per_row * m).sum())
        draft = lg[:, :n].argmax(-1)
        hit = ((draft + d2t[draft]) == greedy[:, k + 1 : k + 1 + n]) & m
        correct.append(hit.sum())
        alive = alive[:, :n] & hit
        chain.append(alive.sum())
    return {
        "ce": torch.stack(ce),
        "correct": torch.stack(correct).to(torch.float64),
        "chain": torch.stack(chain).to(torch.float64),
        "chain_starts": loss_mask[:, 2:].sum().to(torch.float64),
    }


def weighted_loss(ce: torch.Tensor, counts: torch.Tensor, step_weight: float, world: int):
    """sum_k w^k * ce_k / count_k (global counts), scaled by the world size for DDP."""
    w = step_weight ** torch.arange(len(ce), dtype=torch.float64, device=counts.device)
    scale = (w / counts.clamp(min=1.0) * world).to(ce.dtype)
    return (ce * scale.to(ce.device)).sum()


def autocast(batch: dict, dtype):
    """The drafter's forward under train.precision's dtype on the batch's device (None: fp32)."""
    return torch.autocast(batch["input_ids"].device.type, dtype=dtype, enabled=dtype is not None)


def forward_batch(model, head, batch: dict, steps: int, dtype, d2t, loss="soft"):
    """The per-step terms of one batch (ttt_terms): target head, then the drafter's unroll."""
    probs, greedy = head.targets(batch["final_hidden"])
    with autocast(batch, dtype):
        logits = model(batch["aux_hidden"], batch["input_ids"], head.embed, steps, scored_only=True)
    return ttt_terms(logits, probs, greedy, batch["loss_mask"], d2t, loss)
