"""What CUDA graphs take off extraction's forward thread: the toy's capture, replayed.

The toy's forward is bound by one Python thread launching its kernels (benchmarks/RESULTS.md,
"Pairs a few seconds apart ..."): the capture loop alone costs 1.1-1.3x a bare forward, and the
bare forward itself is mostly launches. The job's graphs (eyrie.extract.graphs, set by
capture.cuda_graphs) replay a whole forward, the aux states' stacking and the finite flags
included, as one launch per batch; each batch is padded to a bucket of `--bucket` tokens and to
the full batch size, one graph per bucket, captured once (before the timed loops here).

Loops, alternating in one process, every batch extraction would run (same samples, same order):

- bare forward, eager (the decoder without lm_head, as bench_extract.py's baseline), and the same
  fed from pinned memory;
- eager capture (eyrie.extract.hf.HFCapture.capture_pending into torch's pinned buffers);
- bare forward, graphs (the decoder only, bucketed: bench_extract.bare_graphs): the fair
  baseline for graphs;
- capture, graphs (HFCapture with cuda_graphs=True), into pinned buffers as the eager capture.

It also checks the graphs' states against the eager capture's on the real tokens: how many
values differ, and by how many bf16 steps at most (bucketing changes shapes and the mask's form,
so kernels may differ in their last bits). Needs CUDA for the graphs; on the CPU the same
bucketed forward runs eagerly, which checks the 4-D mask against transformers' own 2-D path.

    python benchmarks/bench_graphs.py --device cuda --samples 1536
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import bench_extract as bench
import numpy as np
import torch
from bench_capture import capture_loop, sync
from common import machine

from eyrie.data.split import read_split
from eyrie.extract.graphs import bucket_of
from eyrie.extract.hf import HFCapture
from eyrie.extract.tokens import tokenize
from eyrie.target.layers import resolve_aux_layer_ids
from eyrie.target.load import load_target, resolve_device


def graph_capture_loop(cap: HFCapture, batches) -> float:
    """Seconds of the graphs' capture over `batches`, at most 8 batches' copies in flight."""
    sync()
    start = time.perf_counter()
    pending = []
    for batch in batches:
        pending.append(cap.capture_pending(batch))
        if len(pending) > 8:
            pending.pop(0).result()
    for p in pending:
        p.result()
    sync()
    return time.perf_counter() - start


def ordered_bits(x: torch.Tensor) -> np.ndarray:
    """bf16 values as integers in their order: neighbours differ by 1 (one step of bf16)."""
    u = x.contiguous().view(torch.int16).numpy().astype(np.int32) & 0xFFFF
    return np.where(u < 0x8000, u, 0x8000 - u)


def largest_difference(target, aux_ids, graphs: HFCapture, batches, pad: int) -> tuple:
    """Over the real tokens of 8 batches: (elements differing, elements, largest difference in
    bf16 steps, largest |difference| over the state's largest |value|) between the graphs'
    states and the eager capture's (steps alone overstate differences near zero)."""
    differing, total, steps, scaled = 0, 0, 0, 0.0
    # one capture's hooks at a time: the eager one's final-norm hook ends any forward
    with HFCapture(target.model, aux_ids, pad_token_id=pad) as eager:
        eager_rows = [eager.capture(seqs) for seqs in batches[:8]]
    for seqs, theirs_rows in zip(batches[:8], eager_rows, strict=True):
        mine_rows = graphs.capture(seqs)
        for (aux, fin), (g_aux, g_fin) in zip(theirs_rows, mine_rows, strict=True):
            for mine, theirs in ((g_aux, aux), (g_fin, fin)):
                gap = np.abs(ordered_bits(mine) - ordered_bits(theirs))
                differing += int((gap > 0).sum())
                total += gap.size
                steps = max(steps, int(gap.max()))
                size = theirs.float().abs().max().clamp_min(1e-30)
                scaled = max(scaled, float((mine.float() - theirs.float()).abs().max() / size))
    return differing, total, steps, scaled


def main(argv=None) -> int:
    ap = bench.workload_args(__doc__.splitlines()[0], samples=1536)
    ap.add_argument("--bucket", type=int, default=64, help="tokens a batch is padded up to")
    args = ap.parse_args(argv)
    print(f"machine:  {machine(resolve_device(args.device).type)}")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        target = load_target(bench.target_dir(args.target, tmp), device=args.device)
        good, _ = tokenize(
            target.tokenizer,
            read_split(bench.split_file(args.data, args.samples, tmp)),
            args.max_tokens,
        )
        batches = bench.extraction_batches(good, 64, args.batch_size)
        layers = target.model.config.get_text_config().num_hidden_layers
        aux_ids = resolve_aux_layer_ids(None, layers)
        decoder, pad = target.model.get_decoder(), target.tokenizer.pad_token_id or 0
        graph_bare = bench.bare_graphs(decoder, args.batch_size, pad, target.device, args.bucket)
        graph_capture = HFCapture(
            target.model,
            aux_ids,
            pad_token_id=pad,
            cuda_graphs=True,
            batch_size=args.batch_size,
            bucket_tokens=args.bucket,
        )
        tokens = sum(len(g.input_ids) for g in good)
        padded = sum(args.batch_size * bucket_of(max(map(len, b)), args.bucket) for b in batches)
        print(
            f"{len(batches)} batches, {tokens} tokens ({padded} with the buckets' padding), "
            f"aux layers {aux_ids}, buckets of {args.bucket} tokens"
        )
        start = time.perf_counter()  # every shape once: eager's first pass, the graphs' capture
        bench.bare_forward(decoder, batches, pad, target.device)
        capture_loop(target, batches, aux_ids, "pinned")
        bench.graph_loop(graph_bare, batches)
        graph_capture_loop(graph_capture, batches)
        print(f"warm-up and graph capture: {time.perf_counter() - start:.1f} s")
        differing, total, steps, scaled = largest_difference(
            target, aux_ids, graph_capture, batches, pad
        )
        print(
            f"graphs vs eager capture, real tokens of 8 batches: {differing} of {total} values "
            f"differ, by at most {steps} bf16 steps and {scaled:.1e} of the state's largest |value|"
        )
        rows, device = [], target.device
        for r in range(args.repeats):
            times = {
                "bare": bench.bare_forward(decoder, batches, pad, device),
                "bare_pinned": bench.bare_forward(decoder, batches, pad, device, pinned=True),
                "capture": capture_loop(target, batches, aux_ids, "pinned"),
                "graph_bare": bench.graph_loop(graph_bare, batches),
                "graph_capture": graph_capture_loop(graph_capture, batches),
            }
            rows.append(times)
            print(
                f"repeat {r}: "
                + " | ".join(f"{k} {v:.3f} s" for k, v in times.items())
                + f" | graph capture / bare {times['graph_capture'] / times['bare']:.3f}x, "
                f"/ bare pinned {times['graph_capture'] / times['bare_pinned']:.3f}x, "
                f"/ graph bare {times['graph_capture'] / times['graph_bare']:.3f}x; eager "
                f"capture / bare pinned {times['capture'] / times['bare_pinned']:.3f}x",
                flush=True,
            )
        med = {k: statistics.median(t[k] for t in rows) for k in rows[0]}
        print(
            "median: "
            + " | ".join(f"{k} {v:.3f} s ({tokens / v:.0f} tok/s)" for k, v in med.items())
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
