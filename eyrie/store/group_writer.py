"""One way to write commit groups into a store: inline, on a writer thread, or in a writer process.

Whichever writer `Writing` picks, a group is appended and committed whole (`store_group`),
groups are committed one at a time in the order they were submitted, and a failure stops every
later commit, so a kill at any instant leaves the store at its last commit:

- inline: each group is written on the caller's thread as it is submitted;
- thread: on one writer thread (eyrie/store/background.py), `depth` groups at most waiting, so
  that compression, checksums and fsync overlap the capture of the next group;
- process: that thread hands each group to a writer process of its own
  (eyrie/store/writer_process.py), which maps the shared slab the group was captured into.

The caller's steps, in order: GroupWriter(how), which starts a writer process at once so that
it imports while the caller gets ready; open, which resumes the store in this process (its
committed samples say what is left to do); writing, the writer taking the groups (drained on
leaving); per group buffer_for, submit and, on the writer's thread, write, then flush; finish
and close.
"""

from __future__ import annotations

import collections
import json
import logging
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from eyrie.store.background import start_writer
from eyrie.store.format import StoreError
from eyrie.store.lock import StoreLock
from eyrie.store.reader import ShardReader
from eyrie.store.remote_writer import store_group
from eyrie.store.slabs import Slab, SlabPool
from eyrie.store.slabs import supported as process_supported
from eyrie.store.writer import SHARD_ENCODER, ShardWriter
from eyrie.store.writer_process import STORE_WRITER, WriterProcess

log = logging.getLogger("eyrie.store.group_writer")
MODES = ("inline", "thread", "process")
__all__ = ["MODES", "GroupWriter", "SlabPool", "Writing", "process_supported", "resume_or_restart"]


@dataclass(frozen=True)
class Writing:
    """Where a store's writer runs, and the settings that change its speed, never its bytes."""

    mode: str = "thread"  # inline | thread | process
    depth: int = 1  # captured groups waiting for the writer thread (thread and process)
    threads: int | str = "auto"  # shard files a commit writes at once (ShardWriter)
    encoder: str = SHARD_ENCODER  # who encodes the token arrays' shard files: eyrie or zarr
    child: str = STORE_WRITER  # the module a writer process runs (a benchmark's stand-in)
    slabs: SlabPool | None = None  # slabs kept for the next writer process; None keeps none

    def __post_init__(self):
        if self.mode not in MODES:
            raise StoreError(f"writer mode {self.mode!r}: use one of {MODES}")
        if self.mode != "inline" and self.depth < 1:
            raise StoreError(f"a {self.mode} writer needs depth >= 1, got {self.depth}")


def resume_or_restart(path: Path, lock: StoreLock, options: dict) -> ShardWriter:
    """A scratch store resumed, or started again when it was begun with another setup.

    `lock` must be held for `path`: a store another process writes is never looked at here.
    """
    if not (lock.held and lock.store == path):
        raise StoreError(f"{path}: opening a scratch store needs its lock held")
    if path.exists():
        try:
            old = ShardReader(path, require_complete=False).attrs.get("provenance")
        except StoreError as exc:
            log.warning("scratch store %s is unusable (%s); starting it again", path, exc)
            old = None
        if old != json.loads(json.dumps(options["provenance"])):
            log.warning("scratch store %s was begun with another setup; starting again", path)
            shutil.rmtree(path)
    return ShardWriter(path, lock=lock, **options)


class GroupWriter:
    """A store's commit groups written by the writer `how` picks (see the module's steps)."""

    def __init__(self, how: Writing):
        self.how = how
        process = how.mode == "process"
        self._process = WriterProcess(how.child, how.slabs) if process else None
        self._store: ShardWriter | None = None  # the store in this process, until a process has it
        self._queue = None  # the writer thread, or inline writing, from writing() on
        self._in_flight: collections.deque = collections.deque()  # sent to the process
        self.took_over = False  # whether the writer process has the store
        self._closed = False

    def open(self, path, lock: StoreLock, **contents) -> GroupWriter:
        """Resume the store at `path` here (see resume_or_restart); `contents` are
        ShardWriter's arguments that say what the store holds."""
        self.path, self.lock = Path(path), lock
        how = {"writer_threads": self.how.threads, "shard_encoder": self.how.encoder}
        self.options = {**contents, **how}
        self._store = resume_or_restart(self.path, lock, self.options)
        return self

    @property
    def _writer(self):
        return self._process if self.took_over else self._store

    @property
    def opened(self) -> bool:
        """Whether a writer has the store (not between a failed open and close)."""
        return self._writer is not None

    @property
    def committed_ids(self) -> list[str]:
        return self._writer.committed_ids

    @property
    def num_samples(self) -> int:
        return self._writer.num_samples

    @property
    def num_tokens(self) -> int:
        return self._writer.num_tokens

    @property
    def complete(self) -> bool:
        return self._store.complete

    @contextmanager
    def writing(self, layouts: list, *, cuda: bool) -> Iterator[GroupWriter]:
        """The writer takes the groups to come; on leaving, every group submitted is written.

        `layouts` are the groups' batches' token counts (a writer process sizes its slabs by
        them); none left means a writer process is never given the store."""
        if self._process is not None and layouts:  # it opens the store, under the caller's lock
            committed, self._store = self._store, None
            committed.close()
            self._process.open(
                self.path,
                self.lock,
                self.options,
                committed=committed,
                layouts=layouts,
                slabs=self.how.depth + 2,
                cuda=cuda,
            )
            self.took_over = True
        with start_writer(0 if self.how.mode == "inline" else self.how.depth) as queue:
            self._queue = queue
            yield self

    @property
    def thread_ids(self) -> tuple[int, ...]:
        return self._queue.thread_ids

    @property
    def pids(self) -> list[int]:
        return [self._process.pid] if self.took_over else []

    @property
    def waited_s(self) -> float:
        """The caller's time blocked on a full queue or a drain."""
        return self._queue.waited_s

    @property
    def slab_seconds(self) -> float | None:
        """Making and registering the process's slabs (None without the process)."""
        return self._process.slab_seconds if self.took_over else None

    @property
    def busy_s(self) -> float | None:
        """The writer process's time storing groups (None without the process)."""
        return self._process.busy_s if self.took_over else None

    def buffer_for(self, layout: list[list[int]]) -> Slab | None:
        """Where a group's states are to be captured: the process's shared slab, else None
        (the capture's own memory). On the caller's thread; waits while every slab is in use."""
        return self._process.slab_for(layout) if self.took_over else None

    def submit(self, work: Callable, *args) -> None:
        """Run work(*args) on the writer's thread after what was submitted before."""
        self._queue.submit(work, *args)

    def wait(self) -> None:
        """Block until everything submitted has run; raise a failed job's error."""
        self._queue.wait()

    def write(self, tag, rows: list, buffer: Slab | None = None) -> list[tuple]:
        """On the writer's thread: append and commit a group's rows (store_group's); the
        (tag, report) of each group committed meanwhile, oldest first."""
        if not self.took_over:
            return [(tag, store_group(self._store, rows))]
        # sent; the group before commits meanwhile, then this one at once
        self._process.send_group(rows, buffer)
        self._in_flight.append(tag)
        return [self._reported()] if len(self._in_flight) > 1 else []

    def flush(self) -> Iterator[tuple]:
        """On the writer's thread: (tag, report) of every group sent and not yet reported,
        each as soon as its commit is done."""
        while self._in_flight:
            yield self._reported()

    def _reported(self) -> tuple:
        tag = self._in_flight.popleft()
        return tag, self._process.take_report()

    def finish(self) -> None:
        """Mark the store complete (every group written)."""
        self._writer.finish()

    def close(self) -> None:
        """Close the store here and stop a writer process; nothing more is committed. The
        counts of what was committed stay readable."""
        if self._closed:
            return
        self._closed = True
        if self._store is not None:
            self._store.close()
        if self._process is not None:
            self._process.close()
