"""The optimizer and its schedule: AdamW over parameter groups, warm-up then cosine.

lm_head starts as the target's own rows (Drafter.init_head_from_target), a good solution
already, at the scale of the target's weights (toy-llama's rows have RMS 0.08). Adam moves
every weight by about lr per step whatever its gradient's size, so at the lr the freshly
initialized layers need (3e-3 on the toy) a few dozen steps overwrite the head the target
handed over; ``head_lr_scale`` gives the head a smaller rate of its own.
"""

from __future__ import annotations

import math

import torch


def make_optimizer(model, settings: dict) -> torch.optim.Optimizer:
    lr, scale = float(settings["lr"]), float(settings["head_lr_scale"])
    head = [p for n, p in model.named_parameters() if n.startswith("lm_head.")]
    rest = [p for n, p in model.named_parameters() if not n.startswith("lm_head.")]
    groups = [{"params": rest, "lr": lr}]
    if scale > 0:
        groups.append({"params": head, "lr": lr * scale})
    else:  # frozen: the target's rows as they are
        for p in head:
            p.requires_grad_(False)
    return torch.optim.AdamW(
        groups,
        lr=lr,
        betas=tuple(settings["betas"]),
        weight_decay=float(settings["weight_decay"]),
    )


def lr_lambda(warmup: int, total: int, min_ratio: float):
    """Linear warm-up to 1, then cosine down to ``min_ratio`` at ``total`` steps."""

    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f
