"""DataLoader throughput over shard stores vs the drafter trainer's consumption, same machine.

Loader: ShardDataset + the trainer's own collate (eyrie.train.data.Pad) in random batches of
--batch-size, for each --workers count, timed after a warm-up batch: samples/s as training would
receive them (decoded, padded; pinned on CUDA). Trainer: optimizer steps of the drafter on
in-memory batches of the same shape (benchmarks/bench_train.py's step), samples/s. The ratio
loader / trainer must stay above 1 for the loader not to be the bottleneck.

The stores are --stores (real ones), or synthetic activation-like ones written here
(tests/synthetic_data.py) at the drafter's width, with sample lengths drawn around
--tokens.

    python benchmarks/bench_loader.py                               # toy width, CPU
    python benchmarks/bench_loader.py --size realistic --device cuda --workers 0 2 4 8
    python benchmarks/bench_loader.py --stores results/store/train/shard-*.zarr
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_train import SIZES, bench
from common import host_line, versions_line
from synthetic_data import synthetic_activations

from eyrie.store.shard import ShardDataset, ShardReader, ShardWriter
from eyrie.train.data import Pad


def write_stores(folder: Path, hidden: int, samples: int, tokens: int, seed: int) -> list[Path]:
    rng = np.random.default_rng(seed)
    path = folder / "shard-000.zarr"
    with ShardWriter(path, hidden_size=hidden, aux_layer_ids=[1, 2, 3], provenance={}) as w:
        for i in range(samples):
            n = int(np.clip(rng.normal(tokens, tokens / 3), 16, 3 * tokens))
            aux, fin = synthetic_activations(rng, n, 3, hidden)
            w.append(f"s{i}", rng.integers(0, 4096, n), np.ones(n, bool), aux, fin)
            if w.buffered_tokens >= 8192:
                w.commit()
        w.finish()
    return [path]


def loader_rate(paths, batch_size, max_len, workers, batches, pin, seed) -> tuple[float, float]:
    ds = ShardDataset(paths)
    g = np.random.default_rng(seed)
    order = g.permutation(len(ds))
    sampler = [
        order[(i * batch_size) % len(ds) :][:batch_size].tolist() for i in range(batches + 1)
    ]
    sampler = [b for b in sampler if len(b) == batch_size] or [order[:batch_size].tolist()]
    loader = torch.utils.data.DataLoader(
        ds,
        batch_sampler=sampler,
        collate_fn=Pad(max_len),
        num_workers=workers,
        pin_memory=pin,
        prefetch_factor=4 if workers else None,
    )
    it = iter(loader)
    next(it)  # warm-up: workers start, first opens
    start, n, tok = time.perf_counter(), 0, 0
    for batch in it:
        n += len(batch["lengths"])
        tok += int(batch["lengths"].sum())
    seconds = time.perf_counter() - start
    return n / seconds, tok / seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--stores", type=Path, nargs="+", help="real stores (default: synthetic)")
    ap.add_argument("--size", choices=sorted(SIZES), default="toy", help="drafter width")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--samples", type=int, default=96, help="synthetic samples")
    ap.add_argument("--tokens", type=int, default=128, help="mean synthetic sample length")
    ap.add_argument("--batches", type=int, default=10, help="timed loader batches")
    ap.add_argument("--steps", type=int, default=3, help="timed trainer steps")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, help="torch threads of the trainer")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    hidden = SIZES[args.size]["hidden_size"]

    scratch = Path(tempfile.mkdtemp(prefix="bench_loader-"))
    try:
        t0 = time.perf_counter()
        paths = args.stores or write_stores(scratch, hidden, args.samples, args.tokens, args.seed)
        made_s = time.perf_counter() - t0
        readers = [ShardReader(p) for p in paths]
        if readers[0].hidden_size != hidden:
            raise SystemExit(f"the stores have hidden size {readers[0].hidden_size}, not {hidden}")
        lengths = np.concatenate([np.diff(r.offsets) for r in readers])
        T = int(min(args.max_len, np.ceil(np.mean(np.minimum(lengths, args.max_len)))))

        autocast = torch.bfloat16 if device.type == "cuda" else None
        trainer = bench(args.size, device, args.batch_size, T, args.ttt_steps, args.steps, autocast)
        train_sps = args.batch_size / trainer["step_s"]
        rows = []
        for w in args.workers:
            sps, tps = loader_rate(
                paths,
                args.batch_size,
                args.max_len,
                w,
                args.batches,
                device.type == "cuda",
                args.seed,
            )
            rows.append((w, sps, tps))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(host_line(torch.cuda.get_device_name() if device.type == "cuda" else "none"))
    print(versions_line())
    src = "given stores" if args.stores else f"synthetic stores written in {made_s:.0f} s"
    print(
        f"data: {len(lengths)} samples, mean {lengths.mean():.0f} tokens ({src}), H={hidden}, "
        f"k=3; batch {args.batch_size}, max_len {args.max_len}"
    )
    print(
        f"trainer ({args.size} drafter, {device}, K={args.ttt_steps}, batch {args.batch_size} x "
        f"{T} tokens, in-memory batches): {trainer['step_s'] * 1e3:.0f} ms/step, "
        f"{train_sps:.1f} samples/s, {trainer['tokens_per_s']:.0f} tokens/s"
    )
    print("| DataLoader workers | samples/s | tokens/s | loader / trainer |")
    print("|---|---|---|---|")
    for w, sps, tps in rows:
        print(f"| {w} | {sps:.1f} | {tps:.0f} | {sps / train_sps:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
