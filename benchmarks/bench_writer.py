"""Write rate of ShardWriter.append + commit by writer thread count (extract.writer_threads).

Prints raw bf16 MB/s (aux_hidden + final_hidden as the forward pass hands them over) of
append + commit at each hidden size, for 1, 2, 4, 8 and 16 threads (capped at the machine's
cores), with the ratio to 1 thread measured in the same run. Thread counts are interleaved
within each repeat, so a busy neighbour slows them alike; the median repeat is reported. Every
store written is also checked to hold the same bytes, file by file, as the 1-thread one.

    python benchmarks/bench_writer.py                    # hidden 256 and 4096
    python benchmarks/bench_writer.py --hidden 4096 --tokens 1024 --samples 64 --repeats 3
    python benchmarks/bench_writer.py --as-extractor     # plus the extractor's per-sample work
    python benchmarks/bench_writer.py --encoder zarr     # shard files written by zarr itself
    python benchmarks/bench_writer.py --hidden 256 --tokens 117 --samples 1536 --commit-every 64 \
        --threads 1 --shard-tokens 16384 4096           # bytes written against bytes stored

Each store also prints the bytes the writing process handed to write() (Linux's
/proc/self/io ``wchar``) against the bytes the store holds: a commit rewrites the shard file it
ends in, so shard files much larger than a commit group write the same bytes several times.

``--as-extractor`` appends as eyrie/extract/shard.py does: each sample's bf16 patterns checked
for Inf/NaN (``all_finite_bits``), then handed over (``append(copy=False)``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import common  # noqa: F401 (puts the repository and tests/ on sys.path)
import numpy as np
from synthetic_data import synthetic_activations

from eyrie.common.provenance import machine
from eyrie.store.format import all_finite_bits, bf16_bits
from eyrie.store.parallel import cores
from eyrie.store.writer import SHARD_ENCODER, SHARD_ENCODERS, ShardWriter

K = 3  # aux layers, as EAGLE-3 captures


def make_samples(hidden: int, tokens: int, distinct: int, seed: int) -> list[tuple]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(distinct):
        aux, fin = synthetic_activations(rng, tokens, K, hidden)
        ids = rng.integers(0, 128_000, tokens)
        mask = np.ones(tokens, dtype=bool)
        mask[: tokens // 4] = False
        out.append((ids, mask, aux, fin))
    return out


def written_bytes() -> int | None:
    """Bytes this process has passed to write() so far (None where /proc/self/io is absent)."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def write(path: Path, hidden: int, pool: list[tuple], args, threads: int, shard: int):
    """(seconds of append + commit for args.samples samples, bytes written meanwhile or None);
    store creation is not counted."""
    shutil.rmtree(path, ignore_errors=True)
    w = ShardWriter(
        path,
        hidden_size=hidden,
        aux_layer_ids=list(range(K)),
        provenance={"benchmark": "bench_writer"},
        chunk_tokens=args.chunk_tokens,
        shard_tokens=shard,
        writer_threads=threads,
        shard_encoder=args.encoder,
    )
    try:
        start, wrote = time.perf_counter(), written_bytes()
        for i in range(args.samples):
            ids, mask, aux, fin = pool[i % len(pool)]
            if args.as_extractor:
                aux, fin = bf16_bits(aux), bf16_bits(fin)
                if not (all_finite_bits(aux) and all_finite_bits(fin)):
                    raise SystemExit("synthetic states hold Inf or NaN")
                w.append(f"sample-{i:05d}", ids, mask, aux, fin, copy=False)
            else:
                w.append(f"sample-{i:05d}", ids, mask, aux, fin)
            if (i + 1) % args.commit_every == 0:
                w.commit()
        w.commit()
        elapsed, after = time.perf_counter() - start, written_bytes()
        return elapsed, (after - wrote if wrote is not None and after is not None else None)
    finally:
        w.close()


def digest(path: Path) -> dict[str, str]:
    return {
        str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(path.rglob("*"))
        if f.is_file()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, nargs="+", default=[256, 4096])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--tokens", type=int, default=512, help="tokens per sample")
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--commit-every", type=int, default=16, help="samples per commit")
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--shard-tokens", type=int, nargs="+", default=[16384])
    ap.add_argument("--distinct", type=int, default=4, help="distinct samples, cycled")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where stores are written")
    ap.add_argument("--json", type=Path, default=None, help="also write the records here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--as-extractor", action="store_true", help="finite check + hand-over")
    ap.add_argument(
        "--encoder",
        choices=SHARD_ENCODERS,
        default=SHARD_ENCODER,
        help="who encodes the token arrays' shard files (eyrie/store/shard_files.py, or zarr)",
    )
    args = ap.parse_args()

    n_cores = cores()
    threads = sorted({t for t in args.threads if t <= n_cores} | {1})
    print("machine:", json.dumps(machine()), f"| usable cores {n_cores}")
    print(
        f"{args.samples} samples x {args.tokens} tokens, {K} aux layers, commit every "
        f"{args.commit_every} samples, chunk {args.chunk_tokens} / shard {args.shard_tokens}, "
        f"shard files encoded by {args.encoder}"
    )
    records = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench_writer-") as tmp:
        for shard, hidden in ((s, h) for s in args.shard_tokens for h in args.hidden):
            pool = make_samples(hidden, args.tokens, args.distinct, args.seed)
            raw_mb = args.samples * args.tokens * (K + 1) * hidden * 2 / 1e6
            seconds = {t: [] for t in threads}
            reference, identical, wrote = None, True, None
            for _ in range(args.repeats):
                for t in threads:
                    path = Path(tmp) / f"h{hidden}-t{t}"
                    elapsed, wrote = write(path, hidden, pool, args, t, shard)
                    seconds[t].append(elapsed)
                    stored = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
                    files = digest(path)
                    reference = reference or files
                    identical &= files == reference
                    shutil.rmtree(path)
            base = statistics.median(seconds[1])
            for t in threads:
                s = statistics.median(seconds[t])
                rec = {
                    "hidden": hidden,
                    "shard_tokens": shard,
                    "threads": t,
                    "encoder": args.encoder,
                    "raw_mb": round(raw_mb, 1),
                    "seconds": [round(x, 3) for x in seconds[t]],
                    "mb_s": round(raw_mb / s, 1),
                    "vs_1_thread": round(base / s, 3),
                    "bytes_identical_to_1_thread": identical,
                    "written_bytes": wrote,
                    "stored_bytes": stored,
                }
                records.append(rec)
                print(
                    f"shard {shard:5d} hidden {hidden:5d} threads {t:2d}: {raw_mb / s:8.1f} MB/s "
                    f"raw bf16 ({base / s:.2f}x 1 thread; median of {len(seconds[t])})"
                )
            if wrote is not None:
                print(
                    f"shard {shard} hidden {hidden}: wrote {wrote / 1e6:.1f} MB for a store of "
                    f"{stored / 1e6:.1f} MB ({wrote / stored:.2f}x)"
                )
            print(f"hidden {hidden}: every store byte-identical to 1 thread: {identical}")
    if args.json:
        args.json.write_text("".join(json.dumps(r) + "\n" for r in records))
    if not all(r["bytes_identical_to_1_thread"] for r in records):
        raise SystemExit("stores written with more threads differ from the 1-thread store")


if __name__ == "__main__":
    main()
