"""A full disk during extraction: which store, how much more it needs, how much is free.

The estimate is the tokens still to capture times the bytes per token the store has taken so
far (or, before the first commit, the raw bf16 size of a token's states over the compression
ratio typical of bf16 activations).
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

TYPICAL_RATIO = 1.4  # lossless ratio of the store's codecs on bf16 hidden states (measured ~1.44)


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether an exception, or one it was raised from, is ENOSPC (or EDQUOT, a full quota)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _dir_bytes(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def message(
    store: Path,
    *,
    out_store: Path,
    stored_tokens: int,
    tokens_left: int,
    layers: int,
    hidden: int,
) -> str:
    """The error text: the store, the space it needs, the space free, and that a rerun resumes."""
    stored = _dir_bytes(store)
    if stored_tokens > 0 and stored > 0:
        per_token = stored / stored_tokens
        how = f"{per_token:.0f} bytes per token, as stored so far"
    else:
        per_token = (layers * hidden * 2) / TYPICAL_RATIO + 5  # + int32 id, uint8 mask
        how = (
            f"{layers} layers x {hidden} x 2 bytes per token at a typical {TYPICAL_RATIO}x "
            "compression"
        )
    need = tokens_left * per_token
    try:
        free = human(shutil.disk_usage(store.parent if store.parent.exists() else ".").free)
    except OSError:
        free = "unknown"
    return (
        f"the disk is full while writing shard store {store} (moved to {out_store} when "
        f"done): it holds {human(stored)} for {stored_tokens} tokens and needs about "
        f"{human(need)} more for the {tokens_left} tokens left ({how}), plus room to finish "
        f"the errors table; {free} is free on its file system. Free space there and rerun "
        "the same command: it resumes from the last commit, losing nothing"
    )


def for_extract(work_store, out_store, writer, good, aux_ids, hidden) -> str:
    """message() for eyrie.extract.shard: `writer` (a ShardWriter, or None when it never opened) and
    `good` (the samples that tokenized) give the tokens stored and left."""
    done = set(writer.committed_ids) if writer is not None else set()
    return message(
        Path(work_store),
        out_store=Path(out_store),
        stored_tokens=writer.num_tokens if writer is not None else 0,
        tokens_left=sum(len(g.input_ids) for g in good if g.sample_id not in done),
        layers=len(aux_ids) + 1,
        hidden=hidden,
    )
