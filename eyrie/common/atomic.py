"""Crash-safe writes: a unique temporary name in the target's folder, flushed, then one rename.

Readers never see half a file, and a killed writer leaves at most a dot-file behind. What is
put in place gets the mode a plain open() or mkdir() would give it under the process's umask
(0644 and 0755 under umask 022), whatever the writer made: safetensors' save_file and mkstemp
make 0600 files, mkdtemp a 0700 folder, which a server running as another user cannot read.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from eyrie.common.disk_full import DiskFullError, full_message, is_disk_full


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def _umask() -> int:
    """The process's umask, read without changing it (Linux); else set and put back."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _share(path: Path) -> None:
    """Give `path` (a file, or a folder and all it holds) the umask's modes: 0o666 & ~umask for
    a file, 0o777 & ~umask for a folder or an executable file (a launch script stays one)."""
    umask = _umask()

    def fix(p: str, st: os.stat_result) -> None:
        full = 0o777 if stat.S_ISDIR(st.st_mode) or st.st_mode & 0o111 else 0o666
        if stat.S_IMODE(st.st_mode) != full & ~umask:
            os.chmod(p, full & ~umask)

    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return
    fix(str(path), st)
    if stat.S_ISDIR(st.st_mode):
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                p = os.path.join(root, name)
                st = os.lstat(p)
                if not stat.S_ISLNK(st.st_mode):
                    fix(p, st)


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
            _share(tmp)
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
    _share(src)
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    _fsync_dir(dst.parent)
    shutil.rmtree(old, ignore_errors=True)
