"""Processes and devices of a run: one process, or one per GPU under torchrun (DDP).

Dist is all the loop knows of the other processes: its rank, the world size, a sum over
processes and a barrier. With one process both are no-ops, so the same code trains alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from eyrie.common.device import pick_device
from eyrie.train.settings import TrainError


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def init_distributed(device_kind: str) -> Dist:
    """The process group of a torchrun launch (WORLD_SIZE > 1); a single process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def setup_processes(device_name: str) -> tuple[Dist, torch.device]:
    """Join the process group (if launched by torchrun), then take this process's device."""
    on_gpu = device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())
    d = init_distributed("cuda" if on_gpu else "cpu")
    return d, pick_device(device_name, "train.device", d.local_rank)


def compute_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for plain fp32 (the default on CPU, where bf16 is slow)."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    if precision in ("fp32", "auto"):
        return None
    raise TrainError(f"train.precision {precision!r} is not one of auto, fp32, bf16")
