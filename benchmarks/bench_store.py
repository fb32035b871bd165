"""Shard store vs one torch.save file per sample: bytes on disk, write time, random-read rate.

Both formats hold the same synthetic activation-like samples (tests/synthetic_data.py).
Reads come from the page cache right after writing, so they measure decoding cost, not disk
speed; on a real disk the smaller store also reads fewer bytes.

    python benchmarks/bench_store.py                      # modest defaults, < 1 min on 2 cores
    python benchmarks/bench_store.py --hidden 7168 --samples 16 --tokens 1536
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numcodecs
import numpy as np
import pandas as pd
import torch
import zarr
from common import host_line, versions_line
from synthetic_data import synthetic_activations

from eyrie.store.shard import ShardDataset, ShardReader, ShardWriter


class PtFiles(torch.utils.data.Dataset):
    """The per-sample baseline: one torch.save dict per sample."""

    def __init__(self, files: list[Path]):
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict:
        return torch.load(self.files[i], weights_only=True)


def make_samples(args) -> list[tuple]:
    rng = np.random.default_rng(args.seed)
    out = []
    for i in range(args.samples):
        aux, fin = synthetic_activations(rng, args.tokens, args.k, args.hidden)
        ids = rng.integers(0, 128_000, args.tokens)
        mask = np.ones(args.tokens, dtype=bool)
        mask[: args.tokens // 4] = False  # the prompt part
        out.append((f"sample-{i:05d}", ids, mask, aux, fin))
    return out


def write_eyrie(path: Path, samples, args) -> float:
    start = time.perf_counter()
    with ShardWriter(
        path,
        hidden_size=args.hidden,
        aux_layer_ids=list(range(args.k)),
        provenance={"benchmark": "bench_store"},
        chunk_tokens=args.chunk_tokens,
        shard_tokens=args.shard_tokens,
    ) as w:
        for j, s in enumerate(samples):
            w.append(*s)
            if (j + 1) % args.commit_every == 0:
                w.commit()
        w.finish()
    return time.perf_counter() - start


def write_pt(folder: Path, samples) -> tuple[float, list[Path]]:
    folder.mkdir(parents=True)
    files = []
    start = time.perf_counter()
    for sid, ids, mask, aux, fin in samples:
        f = folder / f"{sid}.pt"
        record = {
            "input_ids": torch.from_numpy(ids),
            "loss_mask": torch.from_numpy(mask),
            "aux_hidden": aux,
            "final_hidden": fin,
        }
        torch.save(record, f)
        files.append(f)
    return time.perf_counter() - start, files


def read_rate(dataset, workers: int, seed: int) -> float:
    """Samples/s over one epoch in random order, after a warm-up epoch (workers already up)."""
    gen = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=None,
        shuffle=True,
        generator=gen,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    for _ in loader:  # warm-up: worker start-up, first opens
        pass
    start = time.perf_counter()
    n = sum(1 for _ in loader)
    return n / (time.perf_counter() - start)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hidden", type=int, default=2048, help="hidden size H")
    ap.add_argument("--k", type=int, default=3, help="number of aux layers")
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=512, help="tokens per sample")
    ap.add_argument("--commit-every", type=int, default=8, help="samples per commit")
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--shard-tokens", type=int, default=16384)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--dir", type=Path, default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="bench_store-", dir=args.dir))
    try:
        t0 = time.perf_counter()
        samples = make_samples(args)
        gen_s = time.perf_counter() - t0
        n_tok = args.samples * args.tokens
        raw_hidden = (args.k + 1) * args.hidden * 2  # bf16 bytes per token, hidden states only

        eyrie_write = write_eyrie(scratch / "shard", samples, args)
        pt_write, files = write_pt(scratch / "pt", samples)
        del samples
        reader = ShardReader(scratch / "shard")
        assert len(reader) == args.samples
        eyrie_bpt = reader.nbytes_stored() / n_tok
        pt_bpt = folder_bytes(scratch / "pt") / n_tok
        raw_mb = raw_hidden * n_tok / 1e6

        rows = [
            {
                "format": "raw bf16 (hidden only, 8H)" if args.k == 3 else "raw bf16 (hidden only)",
                "bytes/token": raw_hidden,
                "vs raw": 1.0,
                "write s": float("nan"),
                "write MB/s": float("nan"),
            },
            {
                "format": "per-sample torch.save .pt",
                "bytes/token": pt_bpt,
                "vs raw": pt_bpt / raw_hidden,
                "write s": pt_write,
                "write MB/s": raw_mb / pt_write,
            },
            {
                "format": "eyrie shard store",
                "bytes/token": eyrie_bpt,
                "vs raw": eyrie_bpt / raw_hidden,
                "write s": eyrie_write,
                "write MB/s": raw_mb / eyrie_write,
            },
        ]
        size_table = pd.DataFrame(rows)

        read_rows = []
        eyrie_ds = ShardDataset([scratch / "shard"])
        pt_ds = PtFiles(files)
        for w in args.workers:
            e = read_rate(eyrie_ds, w, args.seed)
            p = read_rate(pt_ds, w, args.seed)
            read_rows.append(
                {
                    "DataLoader workers": w,
                    "eyrie samples/s": e,
                    ".pt samples/s": p,
                    "eyrie / .pt": e / p,
                    "eyrie MB/s (decoded)": e * args.tokens * raw_hidden / 1e6,
                }
            )
        read_table = pd.DataFrame(read_rows)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(host_line())
    print(versions_line(zarr=zarr.__version__, numcodecs=numcodecs.__version__))
    print(
        f"data: H={args.hidden} k={args.k} samples={args.samples} tokens/sample={args.tokens}"
        f" ({n_tok} tokens, {raw_mb:.0f} MB raw bf16; generated in {gen_s:.1f} s)"
    )
    print(
        f"store: chunk_tokens={args.chunk_tokens} shard_tokens={args.shard_tokens} "
        f"commit (with fsync) every {args.commit_every} samples; the store's codecs "
        "(eyrie/store/codecs.py: bf16 chunks under 512 KiB as two byte planes)"
    )
    print()
    print(size_table.to_string(index=False, float_format=lambda x: f"{x:,.3f}"))
    print(f"\nstore size vs per-sample .pt: {eyrie_bpt / pt_bpt:.3f}x")
    print("\nrandom-order reads, page cache warm, one epoch after a warm-up epoch:")
    print(read_table.to_string(index=False, float_format=lambda x: f"{x:,.2f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
