"""What the benchmarks share: the repository on sys.path, and the lines that say what a
measurement ran on.

A benchmark runs as `python benchmarks/NAME.py`, so this folder is first on sys.path and
`import common` finds this module. Importing it puts the repository (for eyrie) and tests/ (for
tiny_target and synthetic_data, the stand-ins where models/ or data/ are absent) on sys.path.
A ratio means little without the machine, the versions and how busy the host was, so each
benchmark prints them beside its figures.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

for _path in (ROOT / "tests", ROOT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


def load_average() -> str:
    """The 1, 5 and 15-minute load averages: on a shared host, what else ran meanwhile."""
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def host_line(gpu: str | None = None) -> str:
    """`machine: PLATFORM | N cpus | [GPU NAME |] load average A, B, C`."""
    gpu_part = f" | GPU {gpu}" if gpu is not None else ""
    return (
        f"machine: {platform.platform()} | {os.cpu_count()} cpus{gpu_part} | "
        f"load average {load_average()}"
    )


def versions_line(**others: str) -> str:
    """`python X | torch Y | NAME VERSION ...`: the versions a figure was measured with."""
    import torch

    parts = [f"python {sys.version.split()[0]}", f"torch {torch.__version__}"]
    return " | ".join(parts + [f"{name} {version}" for name, version in others.items()])


def machine(device: str) -> str:
    """One line from eyrie.common.provenance.machine(), plus the host and platform."""
    from eyrie.common.provenance import machine as provenance_machine

    m = provenance_machine()
    gpu = m["gpu"] if device == "cuda" else "none"
    return (
        f"{platform.node()} | {platform.platform()} | CPU {m['cpu']}, {m['cpu_cores']} cores, "
        f"torch threads {m['torch_threads']} | GPU {gpu} | torch {m['torch']}"
    )


def each_and_median(ratios, goal: float | None = None) -> str:
    """`1.020x, 1.100x (median 1.060x[; goal <= 1.10x: met])`: every repeat's ratio, so that a
    host whose speed drifts shows as a spread, and the median, the figure it moves least."""
    median = statistics.median(ratios)
    verdict = (
        "" if goal is None else f"; goal <= {goal:.2f}x: {'met' if median <= goal else 'NOT met'}"
    )
    return ", ".join(f"{r:.3f}x" for r in ratios) + f" (median {median:.3f}x{verdict})"


def default_target() -> str:
    """The shipped config's target (validated by the project's loader): what a default run's
    stores were made from."""
    from eyrie.common.config import load

    return load(ROOT / "config.yaml")["target"]["path"]


def print_profile(step, device, calls: int, rows: int) -> None:
    """The ops that take most of `calls` calls of `step` (the device's time, where there is one)."""
    from torch.profiler import ProfilerActivity, profile

    from eyrie.evaluate.speculate import sync_device

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            step()
        sync_device(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows))
