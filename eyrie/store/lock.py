"""One writer per shard store: an exclusive lock on a file beside the store, `.<name>.lock`.

The lock is `fcntl.flock` on an open file, so the kernel drops it when its process ends, by a
SIGKILL too: a lock is never stale. It lives beside the store, not in it, so deleting or
replacing the store (a restart with another setup) cannot slip past it, and whoever holds it may
delete, create or move the store. The file names the holder (pid, host, start time) for the
message another writer gets. It is removed on release; an acquirer checks that the file it
locked is still the one at the path, so a removal never lets two holders in.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

from eyrie.store.format import StoreError

try:  # POSIX only
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None


def lock_path(store: str | Path) -> Path:
    store = Path(store)
    return store.parent / f".{store.name}.lock"


class StoreLock:
    """Held from acquire() to release() (or the end of the process)."""

    def __init__(self, store: str | Path):
        self.store = Path(store)
        self.path = lock_path(self.store)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> StoreLock:
        """Take the lock, or raise StoreError naming the store and the process that holds it."""
        if fcntl is None or self._fd is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise StoreError(
                    f"{self.store} is being written by another process ({self.holder()}); "
                    "run one writer per shard: wait for it to finish (or stop it) and run this "
                    "again, or give this job its own store path"
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder removed the file as we locked it: lock the new one
        else:  # pragma: no cover - a file removed and recreated 100 times in a row
            raise StoreError(f"{self.path}: could not lock it; is another writer looping?")
        who = f"pid {os.getpid()} on host {socket.gethostname()}, since "
        who += time.strftime("%Y-%m-%d %H:%M:%S %Z")
        os.ftruncate(fd, 0)
        os.pwrite(fd, who.encode(), 0)
        self._fd = fd
        return self

    def fileno(self) -> int:
        """The locked file's descriptor: a child process given it holds the lock too."""
        if self._fd is None:
            raise StoreError(f"{self.store}: the lock is not held")
        return self._fd

    def holder(self) -> str:
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            text = ""
        return text or "pid unknown"

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # while still held: the next acquirer sees a new file
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> StoreLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None


class InheritedLock(StoreLock):
    """The lock of a parent process, passed down as its descriptor (the writer process).

    flock belongs to the open file, which parent and child now share: the lock holds until
    both have ended, so no other writer can open the store while the child still writes.
    Released here only by closing this process's descriptor; the file stays for the parent.
    """

    def __init__(self, store: str | Path, fd: int):
        super().__init__(store)
        if fcntl is not None:
            try:  # the shared open file holds it already, so this succeeds at once if it does
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                msg = f"{self.store}: the lock handed down is not held ({exc})"
                raise StoreError(msg) from None
        self._fd = fd

    def acquire(self) -> InheritedLock:
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
