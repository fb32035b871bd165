"""Where a decoding step's time goes, from a torch profiler trace (SGLang's /start_profile).

SGLang writes one Chrome trace per profiled run (``*.trace.json.gz``): complete events
(``"ph": "X"``) with a category, a name, a start ``ts`` and a duration ``dur`` in
microseconds. This reads, over ``steps`` profiled forward steps (a speculative cycle or a plain
decoding step each):

- ``span_ms``: first kernel's start to last kernel's end, per step;
- ``gpu_busy_ms``: the union of the kernels' intervals per step (overlaps counted once);
- ``gpu_idle_share``: 1 - busy / span, the share of the step the GPU waits on the host;
- the kernels and the CUDA runtime calls that take the most time, with their counts per step.

A step whose GPU idles for most of its span is bound by the host (launches, Python, syncs):
server flags that shorten the host's path matter there, faster kernels do not.

    python benchmarks/trace_summary.py TRACE.json.gz --steps 20
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
RUNTIME_CATEGORIES = {"cuda_runtime", "cuda_driver"}


def read_events(path) -> list[dict]:
    """The trace's complete events; a .gz trace is read compressed."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def top(events: list[dict], n: int, steps: int) -> list[dict]:
    """The n names of the most total time: total ms and calls per step."""
    time, calls = defaultdict(float), defaultdict(int)
    for e in events:
        time[e["name"]] += e["dur"]
        calls[e["name"]] += 1
    ranked = sorted(time, key=time.get, reverse=True)[:n]
    return [{"name": name[:120], "ms_per_step": time[name] / 1e3 / steps,
             "calls_per_step": calls[name] / steps} for name in ranked]  # fmt: skip


def summarize(events: list[dict], steps: int, n: int = 12) -> dict:
    """Span, GPU busy time and the top kernels and runtime calls per step (see the docstring)."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    runtime = [e for e in events if e.get("cat") in RUNTIME_CATEGORIES]
    out = {"steps": steps, "gpu_events": len(gpu), "runtime_events": len(runtime)}
    if gpu:
        start = min(e["ts"] for e in gpu)
        end = max(e["ts"] + e["dur"] for e in gpu)
        busy = union_us([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
        out.update(
            span_ms=(end - start) / 1e3 / steps,
            gpu_busy_ms=busy / 1e3 / steps,
            gpu_idle_share=1.0 - busy / (end - start) if end > start else 0.0,
            kernels_per_step=len(gpu) / steps,
        )
    out["top_kernels"] = top(gpu, n, steps)
    out["top_runtime"] = top(runtime, n, steps)
    return out


def print_summary(s: dict) -> None:
    if "span_ms" in s:
        print(f"{s['steps']} steps: span {s['span_ms']:.3f} ms, GPU busy {s['gpu_busy_ms']:.3f} ms "
              f"({100 * s['gpu_idle_share']:.0f} % idle), {s['kernels_per_step']:.0f} kernels "
              "per step")  # fmt: skip
    else:
        print(f"{s['steps']} steps: no GPU events in the trace")
    for label, key in (("kernels", "top_kernels"), ("CUDA runtime", "top_runtime")):
        print(f"  top {label}:")
        for r in s[key]:
            print(f"    {r['ms_per_step']:8.3f} ms  {r['calls_per_step']:6.1f}x  {r['name']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="a Chrome trace (.json or .json.gz)")
    ap.add_argument("--steps", type=int, required=True, help="forward steps it covers")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    s = summarize(read_events(args.trace), args.steps, args.top)
    print_summary(s)
    print(json.dumps(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
