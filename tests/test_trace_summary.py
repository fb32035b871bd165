"""benchmarks/trace_summary.py: GPU busy time against a brute-force count, and a real trace."""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "trace_summary", ROOT / "benchmarks" / "trace_summary.py"
)
ts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ts)


def test_union_against_a_count_of_covered_microseconds():
    rng = random.Random(0)
    for _ in range(50):
        spans = [(a, a + rng.randint(0, 30)) for a in (rng.randint(0, 200) for _ in range(12))]
        covered = {u for a, b in spans for u in range(a, b)}
        assert ts.union_us(spans) == len(covered)


def test_overlapping_kernels_count_once_and_runtime_calls_rank_apart(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "a", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "b", "ts": 5, "dur": 10},  # overlaps a
        {"ph": "X", "cat": "gpu_memcpy", "name": "copy", "ts": 20, "dur": 5},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 99},  # neither
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 30},  # not a complete event
    ]
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    s = ts.summarize(ts.read_events(path), steps=2)
    assert s["span_ms"] == pytest.approx(25 / 1e3 / 2)
    assert s["gpu_busy_ms"] == pytest.approx(20 / 1e3 / 2)
    assert s["gpu_idle_share"] == pytest.approx(0.2)
    assert [k["name"] for k in s["top_kernels"]] == ["a", "b", "copy"]
    assert s["top_runtime"] == [{"name": "cudaGraphLaunch", "ms_per_step": 0.0015,
                                 "calls_per_step": 0.5}]  # fmt: skip
    with pytest.raises(ValueError, match="steps must be at least 1"):
        ts.summarize([], steps=0)


def test_a_real_torch_profiler_trace_is_read(tmp_path):
    """torch's own export (the format SGLang's /start_profile writes); on a CPU it has no GPU
    events, and says so instead of failing."""
    path = tmp_path / "cpu.trace.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.randn(64, 64) @ torch.randn(64, 64)
    prof.export_chrome_trace(str(path))
    events = ts.read_events(path)
    assert any(e["name"] == "aten::mm" for e in events)
    s = ts.summarize(events, steps=1)
    assert s["gpu_events"] == 0 and "span_ms" not in s and s["top_kernels"] == []
