"""The target's greedy next token from its stored last hidden states (the label of every draft)."""

from __future__ import annotations

import torch


@torch.no_grad()
def greedy_tokens(final: torch.Tensor, lm_head: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """argmax over the full vocabulary of lm_head(final), (...,) int64, in row chunks."""
    flat = final.reshape(-1, final.shape[-1]).to(lm_head.dtype)
    out = [(flat[s : s + chunk] @ lm_head.T).argmax(-1) for s in range(0, flat.shape[0], chunk)]
    if not out:
        return torch.zeros(final.shape[:-1], dtype=torch.long, device=final.device)
    return torch.cat(out).view(final.shape[:-1])
