"""A store's writer in a process of its own (``extract.writer_process``; see group_writer.py).

Why: compression, checksums and the shard files' encoding run Python between their GIL-free
calls, and a forward pass on a GPU launches its kernels from Python too; on one interpreter
every writer thread slowed the forward (benchmarks/RESULTS.md, "Where the rest goes"). Here the
writer runs in a child process and the forward's process only captures.

How the guarantees carry over:

- Data: each commit group is captured straight into a shared slab (eyrie/store/slabs.py); the
  child maps it and appends views of it, so states are neither pickled nor copied on the way.
- Order and commits: the child runs `store_group`, the very step the writer thread runs (the
  finite check, append, commit), one group at a time in submission order; the job's writer
  thread (eyrie/store/background.py) sends the next group before it takes the last one's
  report, so the child never waits for a round trip between commits.
- The lock: the child is given the job's locked file descriptor (eyrie.store.lock
  .InheritedLock); flock belongs to the shared open file, so no other writer gets in while
  either process lives.
- Kills: the child asks the kernel to SIGKILL it when its parent dies (PR_SET_PDEATHSIG), so a
  killed job never leaves a writer behind: the store is at its last commit, as in-process.
- Errors: the child's exception comes back as the same class (EyrieError subclasses, OSError
  with its errno, so a full disk is still recognised), its traceback in the job's log. A child
  that dies is an error naming the store, its exit status and the rerun that resumes.
"""

from __future__ import annotations

import collections
import importlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from eyrie.common.disk_full import human
from eyrie.store.format import StoreError
from eyrie.store.slabs import Slab, SlabPool, aligned, available_memory

log = logging.getLogger("eyrie.store.writer_process")
__all__ = ["STORE_WRITER", "WriterProcess", "WriterProcessError"]
STORE_WRITER = "eyrie.store.remote_writer"  # the module the writer process runs (python -m)


class WriterProcessError(StoreError):
    """The writer process ended without saying why (killed, or out of memory)."""


class WriterProcess:
    """A ShardWriter in a child process, under the caller's lock; `store` sends it one group.

    Started early (it imports while the job tokenizes and hashes), then `open`ed on the
    scratch store once the job has resumed it; `path` is None until then. `child` is the
    module the process runs (a benchmark's stand-in that does part of the work); `pool` keeps
    the slabs for a later writer process (None: they are closed with this one).
    """

    def __init__(self, child: str = STORE_WRITER, pool: SlabPool | None = None):
        self.path: Path | None = None
        self._pool = pool if pool is not None else SlabPool(keep=0)
        self.busy_s = 0.0  # the child's time in store_group
        self.slab_seconds = 0.0  # making and registering the slabs, in open()
        self._slabs: list[Slab] = []
        self._free: list[Slab] = []
        self._in_flight: collections.deque[Slab] = collections.deque()  # sent, not reported
        self._cond = threading.Condition()
        self._failed: BaseException | None = None
        self._dropped: list[int] = []  # slabs replaced here, still mapped by the child
        self._opening = False
        msg_here, msg_there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._fds_here, fds_there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        there = [msg_there.fileno(), fds_there.fileno()]
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([package_root, *sys.path[1:]])}
        args = [sys.executable, "-m", child, str(os.getpid()), *there]
        # started from the job's main thread: PR_SET_PDEATHSIG follows the thread that forked
        self._proc = subprocess.Popen(list(map(str, args)), pass_fds=there, env=env)
        msg_there.close()
        fds_there.close()
        self._conn = Connection(msg_here.detach())

    @property
    def pid(self) -> int:
        return self._proc.pid

    def open(self, store, lock, writer_kwargs: dict, *, committed, layouts, slabs, cuda):
        """Open `store` in the child, under `lock` (held here); `committed` is the caller's
        closed ShardWriter of it, `layouts` the groups left to capture (they size the slabs:
        see `need`)."""
        self.path = Path(store)
        self.aux_count = len(writer_kwargs["aux_layer_ids"])
        self.hidden = int(writer_kwargs["hidden_size"])
        self.committed_ids = list(committed.committed_ids)
        self.num_samples, self.num_tokens = committed.num_samples, committed.num_tokens
        self._cuda, self._max_slabs = cuda, max(2, int(slabs))
        self._slab_bytes = max(map(self.need, layouts))
        self._check_memory(len(layouts))
        tick = time.perf_counter()
        self._make_slabs(min(self._max_slabs, len(layouts)))
        self.slab_seconds = time.perf_counter() - tick
        self._send_fd(b"lock", lock.fileno())
        # the child's answer is read before the first group's (one stream, in order)
        self._opening = True
        self._send({"op": "open", "store": str(self.path), "kwargs": writer_kwargs})

    def _send(self, message: dict) -> None:
        try:
            self._conn.send_bytes(json.dumps(message).encode())
        except OSError as exc:
            raise self._died() from exc

    def _send_fd(self, tag: bytes, fd: int) -> None:
        """A descriptor for the child (the lock, a new slab); a gone child is `_died`'s error."""
        try:
            socket.send_fds(self._fds_here, [tag], [fd])
        except OSError as exc:
            raise self._died() from exc

    def _receive(self) -> dict:
        try:
            reply = json.loads(self._conn.recv_bytes())
        except (EOFError, OSError) as exc:
            raise self._died() from exc
        if reply.get("op") == "failed":
            raise rebuilt(reply["error"], self.path)
        return reply

    def _call(self, message: dict) -> dict:
        if self._in_flight:
            raise StoreError(f"{self.path}: {len(self._in_flight)} groups still unreported")
        self._send(message)
        if self._opening:
            self._opening = False
            self._check_opened(self._receive())
        return self._receive()

    def _check_opened(self, opened: dict) -> None:
        if (opened["num_samples"], opened["num_tokens"]) != (self.num_samples, self.num_tokens):
            raise StoreError(f"{self.path}: the writer process found another commit")

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            self._failed = exc
            self._cond.notify_all()

    def _died(self) -> WriterProcessError:
        try:
            code = self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        how = f"was killed by signal {-code}" if code and code < 0 else f"exited with {code}"
        where = self.path or "this job"
        return WriterProcessError(
            f"the writer process of {where} {how} before answering; the store is at its "
            "last commit and a rerun resumes it (its messages, if any, are above in this log; "
            "extract.writer_process: false writes in the job's own process)"
        )

    # -- slabs --------------------------------------------------------------------------------

    def _check_memory(self, groups: int) -> None:
        """Fail before any capture where the slabs cannot fit in what memory is left."""
        slab = with_margin(self._slab_bytes)  # as slab_for makes them
        count = min(self._max_slabs, groups)
        free = available_memory()
        log.info(
            "%s: the writer process takes up to %d shared slabs of %s (each the largest commit "
            "group's states, padded by batch); %s available",
            self.path,
            count,
            human(slab),
            "unknown" if free is None else human(free),
        )
        if free is not None and count * slab > free:
            raise StoreError(
                f"{self.path}: the writer process needs up to {human(count * slab)} of host memory "
                f"({count} slabs of {human(slab)}: the largest commit group's states, padded by "
                f"batch, locked for the GPU's copies) and this job has {human(free)} left; lower "
                "dataset.max_tokens or the samples per commit (eyrie extract --commit-every), "
                "or give the job more memory (on a cluster: resources.gpu.mem_mb)"
            )

    def need(self, layout: list[list[int]]) -> int:
        """Slab bytes for a group captured as `layout`: its batches, each as its samples' token
        counts (the capture pads a batch to its longest, eyrie.extract.hf)."""
        k, h = self.aux_count, self.hidden
        need = 0
        for lengths in layout:
            rows, t = len(lengths), max(lengths)
            need += aligned(rows * t * k * h * 2) + aligned(rows * t * h * 2)
        tokens = sum(map(sum, layout))
        return need + aligned(tokens * 4) + aligned(tokens)  # its token ids and masks

    def slab_for(self, layout: list[list[int]]) -> Slab:
        """A free slab large enough for a group laid out as `layout` (see `need`; waits while
        every slab is in use).

        Slabs are sized for the job's largest group, so the few there are are made (and
        registered with CUDA) once; one too small is replaced only if a group is larger.
        """
        need = self.need(layout)
        with self._cond:
            while True:
                if self._failed is not None:
                    raise self._failed
                fits = [s for s in self._free if s.nbytes >= need]
                if fits or self._free or len(self._slabs) < self._max_slabs:
                    break
                self._cond.wait(timeout=0.5)
            if fits:
                slab = fits[0]
                self._free.remove(slab)
            else:
                if self._free and len(self._slabs) >= self._max_slabs:  # too small: replace
                    old = self._free.pop()
                    self._slabs.remove(old)
                    if old.announced:  # the child lets go of it with the next group
                        self._dropped.append(old.id)
                    old.close()
                self._slab_bytes = max(need, self._slab_bytes)
                slab = self._new_slab()
                self._slabs.append(slab)
        slab.reset()
        return slab

    def _new_slab(self) -> Slab:
        """A slab of the planned size: a kept one, or a new one registered with CUDA."""
        slab = self._pool.take(self._slab_bytes, self._cuda)
        if slab is None:
            slab = Slab(with_margin(self._slab_bytes))
            if self._cuda:
                slab.register_cuda()
        return slab

    def _make_slabs(self, count: int) -> None:
        """The slabs the groups will use, made before the first capture (in the job's setup).

        Registering a slab with CUDA pins each of its pages, hundreds of MB of them at a realistic
        width; made as the first groups asked for them, that work stood between two batches'
        forwards on the thread that launches them."""
        with self._cond:
            while len(self._slabs) < count:
                slab = self._new_slab()
                self._slabs.append(slab)
                self._free.append(slab)

    def _release(self, slab: Slab) -> None:
        with self._cond:
            self._free.append(slab)
            self._cond.notify_all()

    # -- the writer's work --------------------------------------------------------------------

    def store(self, rows, slab: Slab) -> dict:
        """store_group in the child: rows as in store_group, states living in `slab`."""
        self.send_group(rows, slab)
        return self.take_report()

    def send_group(self, rows, slab: Slab) -> None:
        """Send a group to be stored after those already sent, without waiting for it.

        The child reads its messages in order, so a group sent while it commits the one before
        is started the moment that commit is done: the child does not wait for this thread to
        hear one commit's report before it gets the next group. `take_report` returns the
        reports in the same order; each slab stays in use until its group's report is taken.
        """
        try:
            # the group's token ids and masks go in one piece each (a copy per sample held
            # the interpreter the forward launches its kernels from); each sample's place is
            # its stretch of that piece
            ids_piece, masks_piece = (
                slab.put(np.concatenate([np.asarray(row[k], dtype=dtype) for row in rows]))
                if rows
                else None
                for k, dtype in ((2, np.int32), (3, np.uint8))
            )
            items, start = [], 0
            for line, sample_id, ids, _mask, aux, final, *known in rows:
                n = len(ids)
                items.append(
                    {
                        "line": int(line),
                        "id": sample_id,
                        "ids": stretch(ids_piece, start, n),
                        "mask": stretch(masks_piece, start, n),
                        "aux": slab.place_of(aux),
                        "final": slab.place_of(final),
                        "finite": bool(known[0]) if known else None,
                    }
                )
                start += n
            message = {"op": "group", "slab": slab.id, "items": items}
            # every message goes from this thread, one at a time: a new slab's descriptor
            # and the slabs to let go of travel with the group that first needs it
            with self._cond:
                message["drop"], self._dropped = self._dropped, []
            if not slab.announced:
                self._send_fd(b"slab", slab.fd)
                message["new"] = slab.nbytes
                slab.announced = True
            self._send(message)
            self._in_flight.append(slab)
        except BaseException as exc:
            self._fail(exc)
            raise

    def take_report(self) -> dict:
        """The report of the oldest group sent and not yet reported (waits for its commit)."""
        try:
            if self._opening:
                self._opening = False
                self._check_opened(self._receive())
            report = self._receive()
        except BaseException as exc:
            self._fail(exc)
            raise
        self._release(self._in_flight.popleft())
        self.busy_s += report["busy_s"]
        self.committed_ids += report["stored_ids"]
        self.num_samples, self.num_tokens = report["num_samples"], report["num_tokens"]
        return report

    def finish(self) -> None:
        reply = self._call({"op": "finish"})
        self.num_samples, self.num_tokens = reply["num_samples"], reply["num_tokens"]

    def close(self) -> None:
        """Stop the child (it closes its writer without committing anything more)."""
        if self._proc.poll() is None:
            try:
                self._conn.send_bytes(json.dumps({"op": "close"}).encode())
                self._proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._conn.close()
        self._fds_here.close()
        for slab in self._slabs:  # the child is gone: the pool keeps or closes them
            self._pool.give(slab)
        self._slabs, self._free = [], []


def stretch(place: list, start: int, n: int) -> list:
    """The place of elements [start, start + n) of a 1-D piece at `place` (Slab.put's)."""
    at, dtype, _ = place
    return [at + start * np.dtype(dtype).itemsize, dtype, [n]]


def with_margin(nbytes: int) -> int:
    """A new slab's size for `nbytes` planned: an eighth more, a margin, not a need."""
    return nbytes + nbytes // 8


def rebuilt(error: dict, store: Path) -> BaseException:
    """The child's exception as the same class where that is one of ours or an OSError."""
    from eyrie.common.errors import EyrieError

    log.error("the writer process of %s failed:\n%s", store, error.get("traceback", ""))
    if error.get("errno") is not None:
        return OSError(error["errno"], error["strerror"], error["filename"])
    cls = None
    if str(error.get("module", "")).startswith("eyrie."):
        cls = getattr(importlib.import_module(error["module"]), error["type"], None)
    if isinstance(cls, type) and issubclass(cls, EyrieError):
        try:
            return cls(error["message"])
        except TypeError:
            pass
    return StoreError(f"the writer process of {store} failed: {error['type']}: {error['message']}")
