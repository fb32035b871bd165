"""Crash-safe writes: a unique temporary name in the target's folder, flushed, then one rename.

Readers never see half a file, and a killed writer leaves at most a dot-file behind.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from eyrie.common.disk_full import DiskFullError, full_message, is_disk_full


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (a crash after it cannot bring the old name back)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # pragma: no cover - a file system without directory handles
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` for any writer that takes a file name (pandas, torch,
    safetensors, matplotlib); on a clean exit it is fsynced and renamed onto `path`, on an error
    it is removed and `path` keeps its old content. A full disk, however the writer reports
    it, becomes a DiskFullError naming `path` (the temporary name would tell the user nothing)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _tmp(path)
        try:
            yield tmp
            _fsync_file(tmp)
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        finally:
            tmp.unlink(missing_ok=True)
    except DiskFullError:
        raise
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        raise DiskFullError(path, full_message(path, exc)) from exc


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)


def write_json(path: str | Path, obj, *, indent: int = 1, default=None) -> None:
    write_text(path, json.dumps(obj, indent=indent, default=default) + "\n")


def copy(src: str | Path, dst: str | Path) -> None:
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


def replace_folder(src: str | Path, dst: str | Path) -> None:
    """Replace folder `dst` by folder `src` (same file system), never leaving half of either.

    An old `dst` is renamed aside first and deleted after, so `dst` is always the old folder,
    nothing, or the new one; a kill mid-deletion leaves only a hidden `.old-` folder, which the
    next replacement of `dst` removes.
    """
    src, dst = Path(src), Path(dst)
    for p in dst.parent.glob(f".{dst.name}.old-*"):
        shutil.rmtree(p, ignore_errors=True)
    old = dst.with_name(f".{dst.name}.old-{uuid.uuid4().hex}")
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    _fsync_dir(dst.parent)
    shutil.rmtree(old, ignore_errors=True)
