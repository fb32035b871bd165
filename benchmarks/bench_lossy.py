"""Bytes per token and held-out acceptance of drafters trained on lossy stores vs the lossless one.

The lossy train stores are the given lossless ones rewritten at extract.precision bitround-N
(the same samples in the same order; rounding the stored bf16 states is exactly what extraction
at that precision stores, since the writer rounds the same bf16 values). Every drafter trains
with the same settings and seed, and is scored on the same lossless held-out stores (at serving
time the drafter sees the target's exact states). Printed: bytes/token of the train stores (all
arrays, and the hidden-state arrays alone) against raw bf16, and held-out acc_0..K per drafter,
with the difference to the lossless one.

    python benchmarks/bench_lossy.py --train-stores results/store/train/shard-*.zarr \\
        --heldout-stores results/store/heldout/shard-*.zarr \\
        --vocab results/draft_vocab/vocab.safetensors
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import yaml
from common import ROOT, host_line, versions_line

from eyrie.store.shard import ShardReader, ShardWriter, bf16_bits


def rewrite(src: Path, dst: Path, precision: str) -> Path:
    """The samples of `src`, in order, in a new store at `precision`."""
    r = ShardReader(src)
    with ShardWriter(
        dst,
        hidden_size=r.hidden_size,
        aux_layer_ids=r.aux_layer_ids,
        provenance={**r.attrs.get("provenance", {}), "rewritten_from": str(src)},
        chunk_tokens=int(r.attrs["chunk_tokens"]),
        shard_tokens=int(r.attrs["shard_tokens"]),
        precision=precision,
    ) as w:
        for i in range(len(r)):
            s = r[i]
            w.append(
                s["sample_id"],
                s["input_ids"],
                s["loss_mask"],
                bf16_bits(s["aux_hidden"]),
                bf16_bits(s["final_hidden"]),
            )
            if w.buffered_tokens >= int(r.attrs["shard_tokens"]) // 2:
                w.commit()
        w.finish()
    return dst


def sizes(paths: list[Path]) -> dict:
    def du(p: Path) -> int:
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())

    readers = [ShardReader(p) for p in paths]
    tokens = sum(r.num_tokens for r in readers)
    k, h = len(readers[0].aux_layer_ids), readers[0].hidden_size
    raw = (k + 1) * h * 2
    total = sum(du(p) for p in paths)
    hidden = sum(du(p / "aux_hidden") + du(p / "final_hidden") for p in paths)
    return {
        "tokens": tokens,
        "raw_per_token": raw,
        "bytes_per_token": total / tokens,
        "hidden_per_token": hidden / tokens,
        "vs_raw": total / tokens / raw,
        "hidden_vs_raw": hidden / tokens / raw,
    }


def train_one(job: dict) -> dict:
    from eyrie.train.trainer import train

    torch.set_num_threads(job["threads"])
    t0 = time.perf_counter()
    out = train(
        train_stores=job["train"],
        heldout_stores=job["heldout"],
        target_dir=job["target"],
        vocab_path=job["vocab"],
        out_dir=job["out"],
        settings=job["settings"],
        progress=False,
    )
    out["seconds"] = time.perf_counter() - t0
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--train-stores", type=Path, nargs="+", required=True)
    ap.add_argument("--heldout-stores", type=Path, nargs="+", required=True)
    ap.add_argument("--vocab", type=Path, required=True, help="draft vocabulary (safetensors)")
    ap.add_argument("--target", type=Path, default=ROOT / "models" / "toy-llama")
    ap.add_argument("--config", type=Path, default=ROOT / "config.yaml", help="train settings")
    ap.add_argument("--precisions", nargs="+", default=["bitround-4", "bitround-3", "bitround-2"])
    ap.add_argument("--max-steps", type=int, help="override train.max_steps")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per training run")
    ap.add_argument("--parallel", type=int, default=2, help="training runs at once")
    ap.add_argument("--dir", type=Path, help="scratch folder (default: a temp dir)")
    args = ap.parse_args(argv)

    settings = dict(yaml.safe_load(args.config.read_text())["train"])
    settings.update(processes=1, num_workers=0, device="cpu")
    if args.max_steps:
        settings["max_steps"] = args.max_steps
    scratch = Path(tempfile.mkdtemp(prefix="bench_lossy-", dir=args.dir))
    t0 = time.perf_counter()
    stores = {"lossless": list(args.train_stores)}
    for precision in args.precisions:
        stores[precision] = [
            rewrite(p, scratch / precision / p.name, precision) for p in args.train_stores
        ]
    rewrite_s = time.perf_counter() - t0
    jobs = [
        {
            "train": [str(p) for p in paths],
            "heldout": [str(p) for p in args.heldout_stores],
            "target": str(args.target),
            "vocab": str(args.vocab),
            "out": str(scratch / f"train-{name}"),
            "settings": settings,
            "threads": args.threads,
        }
        for name, paths in stores.items()
    ]
    with ProcessPoolExecutor(args.parallel) as pool:
        results = dict(zip(stores, pool.map(train_one, jobs), strict=True))

    print(host_line())
    print(versions_line())
    first = sizes(stores["lossless"])
    print(
        f"train stores: {len(args.train_stores)}, {first['tokens']} tokens, raw bf16 "
        f"{first['raw_per_token']} B/token; held-out: {len(args.heldout_stores)} lossless stores; "
        f"rewrite {rewrite_s:.0f} s"
    )
    print(f"train settings (same seed for all): {json.dumps(settings, sort_keys=True)}")
    base = results["lossless"]["heldout"]
    K = len(base["acc"])
    head = " | ".join(f"acc_{k}" for k in range(K))
    print(
        f"\n| precision | bytes/token (all) | vs raw | hidden only vs raw | {head} | "
        "acc_0 vs lossless (points) | accept length est. | train s |"
    )
    print("|---|---|---|---|" + "---|" * K + "---|---|---|")
    for name, res in results.items():
        s, h = sizes(stores[name]), res["heldout"]
        accs = " | ".join(f"{a:.4f}" for a in h["acc"])
        delta = 100 * (h["acc"][0] - base["acc"][0])
        print(
            f"| {name} | {s['bytes_per_token']:,.0f} | {s['vs_raw']:.3f} | "
            f"{s['hidden_vs_raw']:.3f} | {accs} | {delta:+.2f} | "
            f"{h['accept_length_estimate']:.3f} | {res['seconds']:.0f} |"
        )
    print(f"\nscratch: {scratch} (delete it when done)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
