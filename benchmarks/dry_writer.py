"""A stand-in writer process for bench_extract.py: the extract job's writer process doing only
part of its work, so that a run times the rest of the job without it.

`bench_extract.py --writer-process dry-reply dry-touch dry-encode` starts it in place of
eyrie.store.remote_writer (the store's Writing.child); EYRIE_BENCH_DRY_WRITER says how
much of each commit group it does:

- reply: nothing; it answers as if every sample were stored (the job's side alone: capture into
  the shared slabs, the job's writer thread, the messages);
- touch: reads every byte of the group's states once (the memory traffic of fresh data);
- encode: compresses every state with the store's codec for a chunk of its size
  (eyrie.store.codecs.hidden_compressors: two byte planes under 512 KiB, Blosc's byte shuffle
  from it) on 8 threads, and writes nothing.

The store it leaves holds no samples; it is a timing device, never a store.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from eyrie.store import remote_writer
from eyrie.store.codecs import byte_planes, hidden_compressors, stored_as_planes
from eyrie.store.shard_files import numcodecs_blosc

MODES = ("reply", "touch", "encode")
MODE = os.environ.get("EYRIE_BENCH_DRY_WRITER")  # read once: the job sets it before the start
_POOL = ThreadPoolExecutor(8)


def _encode(x: np.ndarray) -> bytes:
    """One state as the store encodes a chunk of the bf16 arrays (the state as the chunk)."""
    codec = numcodecs_blosc(hidden_compressors(x.nbytes)[-2])
    return codec.encode(byte_planes(x) if stored_as_planes(x.nbytes) else x)


def dry_store_group(writer, rows) -> dict:
    states = [x for row in rows for x in row[4:6]]
    if MODE == "touch":
        for x in states:
            np.bitwise_or.reduce(x.reshape(-1))
    elif MODE == "encode":
        list(_POOL.map(_encode, states))
    return {
        "stored": [row[0] for row in rows],
        "stored_ids": [row[1] for row in rows],
        "non_finite": [],
        "tokens": sum(len(row[2]) for row in rows),
    }


if __name__ == "__main__":
    if MODE not in MODES:
        raise SystemExit(f"EYRIE_BENCH_DRY_WRITER must be one of {MODES}")
    remote_writer.store_group = dry_store_group
    sys.exit(remote_writer.main(sys.argv[1:]))
