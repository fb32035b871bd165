"""What slows a launch-bound forward pass while other processes work beside it.

The toy's forward without lm_head (every batch of --samples chat samples, bf16 on CUDA) runs on
CPU 0 of its own (the thread extract.pin_forward pins) while interferers of one kind run in
other processes on other CPUs. Each kind's processes are started once, then paused and resumed
(SIGSTOP / SIGCONT) so that every timed pass with them running is paired with one right after
with them stopped: the ratio of each pair cancels the host's drift, which on a shared host is
larger than most effects. Kinds:

- spin: a Python busy loop (one core's ALU, next to no memory traffic);
- cache: numpy copies of 8 MiB arrays (the L2/L3 traffic of a compressor, no DRAM streaming);
- dram: numpy copies of 512 MiB arrays (memory bandwidth);
- zstd: Blosc zstd-1 with byte shuffle and 1 MiB blocks on bf16-like data (the store's codec),
  one thread per process;
- writer: benchmarks/bench_writer.py at the toy's shape with 8 threads (the store's own writer,
  compression, checksums, file writes and fsync), one process over the given CPUs, cycling 4
  samples (which stay in the CPU's caches);
- writer-fresh: the same writer over 1,536 distinct samples (368 MB of states, far more than
  the caches hold), as extraction hands it states it has never read.

`--probe` also runs one spinner on each other CPU in turn, paired the same way: a CPU whose
spinner slows the forward more than the others shares a physical core with CPU 0 (a sibling
the guest's topology may not show).

    python benchmarks/bench_interference.py --device cuda --samples 384 --probe
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_extract import (
    bare_forward,
    extraction_batches,
    split_file,
    target_dir,
    workload_args,
)
from common import ROOT, each_and_median, machine

from eyrie.data.split import read_split
from eyrie.extract.tokens import tokenize
from eyrie.target.load import load_target, resolve_device

LOOPS = {
    "spin": "x = 0\nwhile True: x += 1",
    "cache": "import numpy as np\na = np.ones(1 << 20); b = np.empty_like(a)\nwhile True: b[:] = a",
    "dram": "import numpy as np\na = np.ones(64 << 20); b = np.empty_like(a)\nwhile True: b[:] = a",
    "zstd": (
        "import numpy as np, numcodecs\nnumcodecs.blosc.set_nthreads(1)\n"
        "c = numcodecs.Blosc('zstd', 1, numcodecs.Blosc.SHUFFLE, blocksize=1 << 20)\n"
        "x = np.random.default_rng(0).standard_normal(4 << 20).astype(np.float32)\n"
        "a = (x.view(np.uint32) >> 16).astype(np.uint16)\nwhile True: c.encode(a)"
    ),
}
WRITER = (
    "import runpy, sys\nsys.argv = ['bench_writer', '--hidden', '256', '--tokens', '117', "
    "'--samples', '1536', '--commit-every', '64', '--threads', '8', '--repeats', '1000', "
    "'--shard-tokens', '4096', '--as-extractor', '--distinct', '{distinct}']\n"
    "runpy.run_path('benchmarks/bench_writer.py', run_name='__main__')"
)
KINDS = ("spin", "cache", "dram", "zstd", "writer", "writer-fresh")


def start(kind: str, cpus: list[int]) -> list[subprocess.Popen]:
    if kind.startswith("writer"):  # writer-fresh: 1,536 distinct samples, none left in cache
        distinct = 1536 if kind == "writer-fresh" else 4
        code = f"import os\nos.sched_setaffinity(0, {set(cpus)})\n" + WRITER.format(
            distinct=distinct
        )
        procs = [
            subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL)
        ]
        time.sleep(15 if distinct == 4 else 40)  # it builds its samples first
        return procs
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{c}}})\n{LOOPS[kind]}"]
        )
        for c in cpus
    ]
    time.sleep(2)
    return procs


def signal_all(procs, sig) -> None:
    for p in procs:
        p.send_signal(sig)


def main(argv=None) -> int:
    ap = workload_args(__doc__.splitlines()[0], samples=384)
    ap.add_argument("--pairs", type=int, default=5, help="paired passes per kind")
    ap.add_argument("--probe", action="store_true", help="one spinner on each CPU in turn")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS[:5]), choices=KINDS)
    args = ap.parse_args(argv)
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        print("needs 2 CPUs or more")
        return 1
    fwd, rest = allowed[0], allowed[1:]
    print(f"machine:  {machine(resolve_device(args.device).type)}")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        target = load_target(target_dir(args.target, tmp), device=args.device)
        good, _ = tokenize(
            target.tokenizer, read_split(split_file(args.data, args.samples, tmp)), 512
        )
        batches = extraction_batches(good, 64, args.batch_size)
        base, pad = target.model.get_decoder(), target.tokenizer.pad_token_id or 0
        os.sched_setaffinity(0, {fwd})
        for _ in range(2):  # every batch shape once: a first pass is several times slower
            bare_forward(base, batches, pad, target.device)
        print(f"{len(batches)} batches; forward on CPU {fwd}, interferers on {rest}")

        def paired(kind: str, cpus: list[int], pairs: int) -> None:
            procs = start(kind, cpus)
            ratios, alone = [], []
            try:
                for _ in range(pairs):
                    signal_all(procs, signal.SIGCONT)
                    with_them = bare_forward(base, batches, pad, target.device)
                    signal_all(procs, signal.SIGSTOP)
                    without = bare_forward(base, batches, pad, target.device)
                    ratios.append(with_them / without)
                    alone.append(without)
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
            print(
                f"{kind:6s} x{len(cpus):<2d} on {cpus[0]}-{cpus[-1]}: forward alone "
                f"{statistics.median(alone):.3f} s; with them / alone, each pair: "
                + each_and_median(ratios),
                flush=True,
            )

        half = rest[len(rest) // 2 :] if len(rest) >= 8 else rest
        for kind in args.kinds:
            paired(kind, half if kind in ("cache", "dram", "zstd") else rest, args.pairs)
        if args.probe:
            for cpu in rest:
                paired("spin", [cpu], 3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
