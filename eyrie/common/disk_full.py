"""A full disk: which file could not be written, how much is free, and what to do.

Every stage gets the short form (`DiskFullError`, `describe`): eyrie.common.atomic raises it
naming the output it was writing, and the script adapter and the CLI turn any other ENOSPC into
the same message. Extraction adds an estimate (`for_extract`): the tokens still to capture times
the bytes per token the store has taken so far (or, before the first commit, the raw bf16 size
of a token's states over the compression ratio typical of bf16 activations).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from eyrie.common.errors import EyrieError

TYPICAL_RATIO = 1.4  # lossless ratio of the store's codecs on bf16 hidden states (RESULTS.md)
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# How libraries that do not raise OSError report a full disk: the C library's strerror (Rust's
# io::Error in safetensors, h5py, ...) and torch.save's stream writer, which drops the errno.
FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "StorageFull")
TORCH_WRITE_FAILED = "PytorchStreamWriter failed writing file"


class DiskFullError(EyrieError, OSError):
    """A write that failed for want of space, named by the output it was writing.

    An OSError with errno ENOSPC too, so code that already handles a full disk (extraction's
    resume message) still recognizes it.
    """

    def __init__(self, path: str | Path, message: str):
        OSError.__init__(self, errno.ENOSPC, message, str(path))
        self.message = message

    def __str__(self) -> str:
        return self.message


def _chain(exc: BaseException | None):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether an exception, or one it was raised from, is ENOSPC (or EDQUOT, a full quota),
    also when a library reports it in its own exception class."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in FULL_ERRNOS:
            return True
        text = str(e)
        if any(t in text for t in FULL_TEXTS) or TORCH_WRITE_FAILED in text:
            return True
    return False


def failed_path(exc: BaseException | None) -> str | None:
    """The file an OSError of the chain names, if any."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.filename:
            return os.fsdecode(e.filename)
    return None


def _existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _mount(path: Path) -> Path:
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def free_space(path: str | Path) -> str:
    """'N GB free on the file system mounted at M' for the folder holding `path`."""
    where = _existing(Path(path))
    try:
        free = human(shutil.disk_usage(where).free)
    except OSError:
        return "the free space is unknown"
    return f"{free} is free on the file system mounted at {_mount(where)}"


def describe(exc: BaseException, fallback: str | Path | None = None) -> str:
    """The message for a full disk: the file being written (or `fallback`, the output of the
    job, when the error names none), the space free there, and the fix."""
    if isinstance(exc, DiskFullError):
        return exc.message
    path = failed_path(exc) or (str(fallback) if fallback else None)
    return full_message(path, exc)


def full_message(path: str | Path | None, exc: BaseException) -> str:
    what = f"writing {path} failed" if path else "a write failed"
    where = free_space(path if path else ".")
    return (
        f"the disk is full: {what} ({_reason(exc)}); {where}. Free space there (or set "
        "`results` to a folder on a larger disk) and rerun the same command: outputs already "
        "finished are kept, and this one is written again"
    )


def _reason(exc: BaseException) -> str:
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in FULL_ERRNOS:
            return e.strerror or os.strerror(e.errno)
    return "No space left on device"


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
    """message() for eyrie.extract.shard: `writer` (the store's, or None when it never opened) and
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
