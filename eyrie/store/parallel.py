"""Several threads for one commit: the store's shard files are written side by side.

Where a commit's time goes (docs/store-format.md, "Writing on several threads"): Zarr already
compresses the chunks of one shard concurrently (Blosc in its thread pool), but everything
else of a write runs on Zarr's one event-loop thread: a fill-value chunk allocated and the
values copied into it for every chunk of a shard, the crc32c and its copy, the shard's
concatenation; and the writer wrote the four token arrays one after another. So one core
does most of the work whatever the machine has.

A commit splits cleanly into (array, shard) pieces: every piece is a whole file of its own, so
pieces written at once cannot touch each other's bytes, and a file's content depends only on
the values it holds, never on how the writes were split (the stored bytes stay identical).
Each of ``writer_threads`` threads runs its pieces on an event loop of its own (Zarr's async
API), so the event-loop work runs on all of them; their Blosc and file writes share one pool
as large as Zarr's own (cores + 4, at most 32). 1 is the single-threaded path: one write per
array, in order, on Zarr's own loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from eyrie.common.errors import EyrieError

AUTO = "auto"
AUTO_MAX = 8  # more threads than this gained nothing measurable (benchmarks/bench_writer.py)


class WriterThreadsError(EyrieError, ValueError):
    """A writer_threads setting that is neither "auto" nor a positive int."""


def cores() -> int:
    """CPU cores this process may run on (the affinity mask, e.g. a Slurm allocation)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resolve_threads(setting: int | str | None) -> int:
    """The thread count of an ``extract.writer_threads`` value: "auto" is min(8, cores)."""
    if setting is None or setting == AUTO:
        return max(1, min(AUTO_MAX, cores()))
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise WriterThreadsError(
            f"extract.writer_threads {setting!r}: use 'auto' or a whole number >= 1 "
            "(1: every array written on one thread)"
        )
    return setting


def spans(lo: int, hi: int, outer: int, split: bool) -> list[tuple[int, int]]:
    """[lo, hi) cut at multiples of `outer` (the shard length) when split, else whole."""
    if not split:
        return [(lo, hi)]
    cuts = [lo, *range((lo // outer + 1) * outer, hi, outer), hi]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


class Pool:
    """Run jobs on `threads` threads (inline for 1) and return only when all have ended.

    The first error is raised after every job has finished, so no write of a failed commit is
    still running when the caller goes on (and the commit record is never written after it).
    """

    def __init__(self, threads: int):
        self.threads = threads
        self._jobs = self._codec = None
        if threads > 1:
            self._jobs = ThreadPoolExecutor(threads, thread_name_prefix="eyrie-store")
            codec = max(threads, min(32, cores() + 4))  # as many as Zarr's own pool has
            self._codec = ThreadPoolExecutor(codec, thread_name_prefix="eyrie-store-codec")
        self._local = threading.local()
        self._loops: list[asyncio.AbstractEventLoop] = []
        self._lock = threading.Lock()

    def run(self, jobs: Iterable[Callable[[], object]]) -> None:
        if self._jobs is None:
            for job in jobs:
                job()
            return
        futures = [self._jobs.submit(job) for job in jobs]
        errors = [f.exception() for f in futures]  # waits for each
        for exc in errors:
            if exc is not None:
                raise exc

    def map(self, fn: Callable, items: Iterable) -> None:
        self.run([lambda x=x: fn(x) for x in items])

    def setitem(self, arr, selection: slice, value) -> None:
        """``arr[selection] = value``; on a job thread, through that thread's own event loop."""
        if self._jobs is None:
            arr[selection] = value
            return
        self._loop().run_until_complete(arr.async_array.setitem(selection, value))

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = getattr(self._local, "loop", None)
        if loop is None:
            loop = self._local.loop = asyncio.new_event_loop()
            loop.set_default_executor(self._codec)  # Blosc and file writes of every job thread
            with self._lock:
                self._loops.append(loop)
        return loop

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.shutdown(wait=True)
            self._codec.shutdown(wait=True)
            self._jobs = self._codec = None
        with self._lock:
            loops, self._loops = self._loops, []
        for loop in loops:
            loop.close()
