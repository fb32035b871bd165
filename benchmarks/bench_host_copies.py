"""Device-to-host copies into each kind of host memory the capture can use, beside a forward.

Why: at Llama-3-8B's shape, capturing into the writer's shared slabs (memfd pages registered
with cudaHostRegister, eyrie/store/slabs.py) cost about 10 % more than capturing into torch's
pinned buffers (benchmarks/RESULTS.md, "the capture loop without a writer"). This times the
copies alone, so the cause is measured rather than guessed:

- bandwidth: one batch's states (`--mb`) copied into each memory kind, on a stream of its own;
- the host's wait: how long the `copy_(non_blocking=True)` call itself holds the launching thread
  while the GPU is busy (an asynchronous copy returns at once; a staged one waits for the GPU);
- beside work: a chain of bf16 matrix products of the 8B MLP's shape (one "batch" of `--tokens`
  tokens) on the default stream, each followed by a copy of `--mb` on the copy stream into the
  kind's buffers (8 in turn, as a commit group's), against the same chain with no copies.

Kinds: torch's pinned allocator; a memfd slab registered with CUDA (the job's); the same with
transparent huge pages asked for (madvise) before its pages are touched; an anonymous private
mapping registered the same way; plain pageable memory.

    python benchmarks/bench_host_copies.py                      # needs CUDA
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from common import machine


class Registered:
    """Host memory from `mapping`, registered with CUDA; `tensor(i)` is the i-th buffer."""

    def __init__(self, nbytes: int, count: int, how: str):
        self.size = nbytes
        self.slab = None
        if how in ("slab", "slab-thp"):
            fd = os.memfd_create("eyrie-bench", os.MFD_CLOEXEC)
            os.ftruncate(fd, nbytes * count)
            self.map = mmap.mmap(fd, nbytes * count)
            os.close(fd)
        else:  # anonymous, private
            self.map = mmap.mmap(-1, nbytes * count, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if how == "slab-thp":
            self.map.madvise(mmap.MADV_HUGEPAGE)
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)
        self.bytes[::4096] = 0  # touch every page (after the madvise)
        tick = time.perf_counter()
        err = torch.cuda.cudart().cudaHostRegister(self.bytes.ctypes.data, nbytes * count, 0)
        self.register_s = time.perf_counter() - tick
        if int(getattr(err, "value", err)) != 0:
            raise RuntimeError(f"cudaHostRegister refused: {err}")

    def tensor(self, i: int) -> torch.Tensor:
        at = i * self.size
        return torch.from_numpy(self.bytes[at : at + self.size]).view(torch.bfloat16)

    def close(self) -> None:
        torch.cuda.cudart().cudaHostUnregister(self.bytes.ctypes.data)


def host_buffers(kind: str, nbytes: int, count: int):
    n = nbytes // 2
    if kind == "pinned":
        return [torch.empty(n, dtype=torch.bfloat16, pin_memory=True) for _ in range(count)], None
    if kind == "pageable":
        return [torch.empty(n, dtype=torch.bfloat16) for _ in range(count)], None
    reg = Registered(nbytes, count, {"memfd": "slab", "memfd-thp": "slab-thp"}.get(kind, kind))
    return [reg.tensor(i) for i in range(count)], reg


def huge_pages_note() -> str:
    out = []
    for name in ("enabled", "shmem_enabled"):
        p = Path("/sys/kernel/mm/transparent_hugepage") / name
        out.append(f"{name}: {p.read_text().strip() if p.exists() else 'absent'}")
    return "; ".join(out)


def bandwidth(src: torch.Tensor, bufs, stream, rounds: int = 20) -> float:
    """GB/s of copies of `src` into `bufs` in turn, on `stream`, timed by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        start.record()
        for i in range(rounds):
            bufs[i % len(bufs)].copy_(src, non_blocking=True)
        end.record()
    end.synchronize()
    return rounds * src.numel() * 2 / (start.elapsed_time(end) / 1e3) / 1e9


def host_wait(src, bufs, stream, busy) -> float:
    """Milliseconds the copy_ call itself takes while the default stream is busy."""
    torch.cuda.synchronize()
    busy()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        tick = time.perf_counter()
        bufs[0].copy_(src, non_blocking=True)
        took = time.perf_counter() - tick
    torch.cuda.synchronize()
    return took * 1e3


def beside_work(src, bufs, stream, weights, x, batches: int) -> float:
    """Seconds of `batches` MLP-shaped chains, each followed by a copy (bufs None: no copy)."""
    torch.cuda.synchronize()
    tick = time.perf_counter()
    for b in range(batches):
        h = x
        for w_up, w_down in weights:
            h = torch.nn.functional.silu(h @ w_up) @ w_down
        if bufs is not None:
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                bufs[b % len(bufs)].copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return time.perf_counter() - tick


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=32, help="one batch's states, MB")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens of one work batch")
    ap.add_argument("--layers", type=int, default=32, help="MLP-shaped products per batch")
    ap.add_argument("--batches", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--kinds",
        nargs="+",
        default=["pinned", "memfd", "memfd-thp", "anon", "pageable"],
    )
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_host_copies needs CUDA")
        return 2
    print(f"machine:  {machine('cuda')}")
    print(f"transparent huge pages: {huge_pages_note()}")
    nbytes = args.mb << 20
    src = torch.randn(nbytes // 2, device="cuda").to(torch.bfloat16)
    stream = torch.cuda.Stream()
    torch.manual_seed(0)
    weights = [
        (
            torch.randn(4096, 14336, device="cuda", dtype=torch.bfloat16) * 0.01,
            torch.randn(14336, 4096, device="cuda", dtype=torch.bfloat16) * 0.01,
        )
    ] * args.layers
    x = torch.randn(args.tokens, 4096, device="cuda", dtype=torch.bfloat16)
    big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def busy():  # ~50 ms of GPU work queued ahead of the copy
        for _ in range(40):
            big @ big

    kinds = {}
    for kind in args.kinds:
        bufs, reg = host_buffers(kind, nbytes, 8)
        kinds[kind] = (bufs, reg)
        extra = f", registered in {reg.register_s * 1e3:.0f} ms" if reg else ""
        print(f"{kind}: 8 buffers of {args.mb} MB{extra}")
    beside_work(src, None, stream, weights, x, 4)  # warm up
    for r in range(args.repeats):
        alone = beside_work(src, None, stream, weights, x, args.batches)
        parts = [f"repeat {r}: work alone {alone:.3f} s"]
        for kind, (bufs, _) in kinds.items():
            gbps = bandwidth(src, bufs, stream)
            wait = host_wait(src, bufs, stream, busy)
            took = beside_work(src, bufs, stream, weights, x, args.batches)
            parts.append(
                f"{kind} {gbps:.1f} GB/s, copy_ call {wait:.2f} ms, beside work {took:.3f} s "
                f"({took / alone:.3f}x)"
            )
        print(" | ".join(parts))
    for _, reg in kinds.values():
        if reg is not None:
            reg.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
