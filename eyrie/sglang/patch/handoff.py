"""The hand-off from the forward pass to the dump files, off the scheduler's thread.

Runs inside the server (see protocol.py): standard library and torch only, relative imports.

The hooks run on the thread that launches the forward pass. Anything that waits there (a copy
to the host, which waits for the GPU to reach it; serializing and writing a file) holds the
whole server back, and in eager mode the GPU then idles too. So the forward's thread only
queues work:

1. the hooks put our rows of each aux layer into one staging tensor on the GPU (a copy on the
   GPU, queued on the forward's stream like any kernel);
2. at the final norm, `to_host` queues the copies of the pass's states into pinned host memory
   on a stream of its own, which waits for the forward's stream up to that point; an event
   marks their end;
3. `PassWriter`, a thread of its own, waits for that event (the wait releases the GIL) and
   writes one chunk file per request straight from the pinned buffers.

The queue between 2 and 3 is bounded: when the writer falls behind, the forward's thread waits
for room, so host memory stays bounded and the server slows down rather than dumping late.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class HostPass:
    """One pass's states on the host (pinned on CUDA), ready once `event` has completed."""

    aux: torch.Tensor  # (rows, k, H): our rows only, in the pass's order
    final: torch.Tensor  # (rows, H)
    ids: torch.Tensor | None  # (rows,) int64
    positions: torch.Tensor | None  # (rows,) int64
    flags: dict = field(default_factory=dict)  # name -> 0-dim bool tensor (checks on device)
    event: object = None  # torch.cuda.Event of the copies; None on the CPU
    keep: tuple = ()  # device tensors the copies read, held until they are done
    write: Callable[[HostPass], None] | None = None  # what the writer does with it
    tag: object = None  # the writer's context for this pass
    nbytes: int = 0

    def ready(self) -> None:
        """Wait until the copies have landed (releases the GIL while waiting)."""
        if self.event is not None:
            self.event.synchronize()
        self.keep = ()


class HostCopy:
    """Queues device-to-host copies of a pass's states on a stream of their own."""

    def __init__(self):
        self._streams: dict = {}

    def _stream(self, device: torch.device):
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        return self._streams[device]

    def to_host(self, aux, final, ids, positions, flags: dict | None = None) -> HostPass:
        """The pass's tensors as a HostPass; on CUDA the copies are queued, not waited for.

        The device tensors must not change after this call until the copies are done: the
        hooks hand over tensors of their own (the staging tensor, index_select results or
        clones), never SGLang's buffers.
        """
        flags = dict(flags or {})
        tensors = [t for t in (aux, final, ids, positions) if t is not None]
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        if aux.device.type != "cuda":
            return HostPass(aux, final, ids, positions, flags, nbytes=nbytes)
        device = aux.device
        side = self._stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        keep = (*tensors, *flags.values())
        with torch.cuda.stream(side):
            host = [_pinned_copy(t, side) for t in (aux, final, ids, positions)]
            host_flags = {name: _pinned_copy(f, side) for name, f in flags.items()}
            event = torch.cuda.Event()
            event.record(side)
        return HostPass(*host, host_flags, event=event, keep=keep, nbytes=nbytes)


def _pinned_copy(t, stream):
    """A pinned host copy of a device tensor, queued on `stream` (which is current)."""
    if t is None:
        return None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    t.record_stream(stream)  # the allocator must not hand its memory out before the copy
    return host


EXIT_FLUSH_S = 30.0  # the longest an exiting process waits for its queued passes


@dataclass
class Timings:
    """Where the dump path's time goes, in seconds (reported in the status file)."""

    hooks_s: float = 0.0  # on the forward's thread, inside the hooks
    queue_wait_s: float = 0.0  # on the forward's thread, waiting for room in the queue
    copy_wait_s: float = 0.0  # on the writer, waiting for the copies to land
    write_s: float = 0.0  # on the writer, writing files
    passes_written: int = 0
    bytes_written: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, seconds: float) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + seconds)

    def as_dict(self) -> dict:
        with self.lock:
            return {
                "hooks_s": round(self.hooks_s, 4),
                "queue_wait_s": round(self.queue_wait_s, 4),
                "copy_wait_s": round(self.copy_wait_s, 4),
                "write_s": round(self.write_s, 4),
                "passes_written": self.passes_written,
                "bytes_written": self.bytes_written,
            }


class PassWriter:
    """`threads` daemon threads that write the queued passes; `depth` passes wait at most.
    Each pass's files are independent of the others' (a chunk is named by its rid and prefix),
    so they need no order; two threads keep a tmpfs's page allocation off the critical path
    at Llama-3.1-8B's width (one thread's rate: benchmarks/RESULTS.md, "Figures behind code
    comments").

    `on_idle()` runs on the thread once it has had nothing to write for `idle_s` after a write
    (the dumper refreshes its status file there, so the counters are current once work stops).
    """

    def __init__(
        self, timings: Timings, depth=8, *, threads=2, on_error=None, on_idle=None, idle_s=0.5
    ):
        self.timings = timings
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._on_error = on_error
        self._on_idle = on_idle
        self._idle_s = idle_s
        self._threads = threads
        self._workers: list[threading.Thread] | None = None
        self._idle = threading.Condition()
        self._pending = 0

    def put(self, item: HostPass) -> None:
        if self._workers is None:  # started on first use: after SGLang forked its processes
            self._workers = [
                threading.Thread(target=self._run, name=f"eyrie-dump-{i}", daemon=True)
                for i in range(self._threads)
            ]
            for worker in self._workers:
                worker.start()
            # An orderly exit of the process waits for what was handed over: the files are
            # written whole, and no writer thread is inside torch while the interpreter
            # finalizes (a C++ abort, "terminate called without an active exception").
            atexit.register(self.flush, EXIT_FLUSH_S)
        with self._idle:
            self._pending += 1
        t0 = time.perf_counter()
        self._queue.put(item)
        self.timings.add("queue_wait_s", time.perf_counter() - t0)

    def flush(self, timeout: float = 60.0) -> bool:
        """Wait until every queued pass is written; whether that happened within `timeout`."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _run(self) -> None:
        t = self.timings
        dirty = False
        while True:
            try:
                item = self._queue.get(timeout=self._idle_s if dirty else None)
            except queue.Empty:
                dirty = False
                if self._on_idle is not None:
                    self._on_idle()
                continue
            dirty = True
            try:
                t0 = time.perf_counter()
                item.ready()
                t1 = time.perf_counter()
                item.write(item)
                t.add("copy_wait_s", t1 - t0)
                t.add("write_s", time.perf_counter() - t1)
                with t.lock:
                    t.passes_written += 1
                    t.bytes_written += item.nbytes
            except Exception as exc:  # never let the thread die: the pass's requests are told
                if self._on_error is not None:
                    self._on_error(item, exc)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()
