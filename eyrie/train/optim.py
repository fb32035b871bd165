"""The optimizer and its schedule: AdamW (or Muon for the matrices), warm-up then cosine.

lm_head starts as the target's own rows (Drafter.init_head_from_target), a good solution
already, at the scale of the target's weights (toy-llama's rows have RMS 0.08). Adam moves
every weight by about lr per step whatever its gradient's size, so at the lr the freshly
initialized layers need (3e-3 on the toy) a few dozen steps overwrite the head the target
handed over; ``head_lr_scale`` gives the head a smaller rate of its own.

``optimizer: muon`` gives the decoder layer's and fc's weight matrices to torch's Muon (an
orthogonalized momentum update, its rate matched to AdamW's update size) and the rest (norms,
lm_head) to AdamW, as speculators trains by default.
"""

from __future__ import annotations

import math

import torch


def make_optimizer(model, settings: dict) -> torch.optim.Optimizer:
    lr, scale = float(settings["lr"]), float(settings["head_lr_scale"])
    head = [p for n, p in model.named_parameters() if n.startswith("lm_head.")]
    rest = [p for n, p in model.named_parameters() if not n.startswith("lm_head.")]
    use_muon = settings["optimizer"] == "muon"

    def to_muon(p) -> bool:  # Muon orthogonalizes matrices; vectors stay with AdamW
        return use_muon and p.ndim == 2 and min(p.shape) > 1

    matrices = [p for p in rest if to_muon(p)]
    groups = [{"params": [p for p in rest if not to_muon(p)], "lr": lr}]
    if scale > 0:
        groups.append({"params": head, "lr": lr * scale})
    else:  # frozen: the target's rows as they are
        for p in head:
            p.requires_grad_(False)
    adamw = torch.optim.AdamW(
        groups, lr=lr, betas=tuple(settings["betas"]), weight_decay=float(settings["weight_decay"])
    )
    if not matrices:
        return adamw
    muon = torch.optim.Muon(
        [{"params": matrices, "lr": lr}],
        lr=lr,
        weight_decay=float(settings["muon_weight_decay"]),
        adjust_lr_fn="match_rms_adamw",
    )
    return Paired(muon, adamw)


class Paired(torch.optim.Optimizer):
    """Two optimizers stepped as one, so that one schedule, checkpoint and clip serve both.

    ``param_groups`` are the two optimizers' own group dicts, so the LR schedule's writes
    reach them; the state dict holds each one's."""

    def __init__(self, *parts: torch.optim.Optimizer):
        self.parts = parts
        super().__init__([p for part in parts for g in part.param_groups for p in g["params"]], {})
        self.param_groups = [g for part in parts for g in part.param_groups]

    @torch.no_grad()
    def step(self, closure=None):
        for part in self.parts:
            part.step()

    def zero_grad(self, set_to_none: bool = True):
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state_dict: dict) -> None:
        for part, state in zip(self.parts, state_dict["parts"], strict=True):
            part.load_state_dict(state)


def lr_lambda(warmup: int, total: int, min_ratio: float):
    """Linear warm-up to 1, then cosine down to ``min_ratio`` at ``total`` steps."""

    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f
