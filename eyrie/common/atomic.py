"""Crash-safe writes: a unique temporary name in the target's folder, flushed, then one rename.

Readers never see half a file, and a killed writer leaves at most a dot-file behind.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: str | Path, obj, *, indent: int = 1, default=None) -> None:
    write_text(path, json.dumps(obj, indent=indent, default=default) + "\n")


def copy(src: str | Path, dst: str | Path) -> None:
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(dst)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


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
    shutil.rmtree(old, ignore_errors=True)
