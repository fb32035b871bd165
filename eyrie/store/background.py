"""One writer thread with a bounded queue: compression, checksums and fsync off the forward path.

The extract loop hands each captured commit group to `BackgroundWriter.submit` and goes on with
the next group's forward passes while the thread appends, compresses, writes and commits the
previous one. The thread keeps what writing on the caller's thread guarantees:

- Order: jobs run one at a time, in submission order, on one thread, so commits happen in the
  order of the groups and each commit follows the writes it covers (ShardWriter.commit writes
  and fsyncs the data, then replaces the commit record). A SIGKILL at any instant leaves the
  store at its last commit.
- Errors: an exception in a job is kept and raised in the caller's thread at its next submit,
  wait or close (the original exception, so ``except StoreError`` still works). Jobs submitted
  after a failed one are skipped: nothing is committed after a failure.
- Memory: at most ``depth`` groups wait in the queue, plus the one being written; ``submit``
  blocks (and counts the time in ``waited_s``) while the queue is full.

Blosc releases the GIL while it compresses, and so does torch in a forward pass, so the two
overlap on a CPU with two cores or more, and fully when the forward pass runs on a GPU.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

_STOP = object()


class BackgroundWriter:
    """Run callables on one thread, in order; at most `depth` wait while one runs."""

    def __init__(self, depth: int = 1, name: str = "eyrie-writer"):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._closed = False
        self.waited_s = 0.0  # caller's time blocked on a full queue or a drain
        self.busy_s = 0.0  # the thread's time running jobs
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def thread_ids(self) -> tuple[int, ...]:
        """The native id of the writer thread (eyrie.extract.cpus pins it)."""
        return (self._thread.native_id,)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if self._error is None:  # after a failure, later jobs are skipped
                    fn, args = item
                    start = time.perf_counter()
                    try:
                        fn(*args)
                    except BaseException as exc:  # handed to the caller's thread
                        self._error = exc
                    finally:
                        self.busy_s += time.perf_counter() - start
            finally:
                self._queue.task_done()

    def submit(self, fn: Callable, *args) -> None:
        """Queue fn(*args); blocks while `depth` jobs wait. Raises a failed job's error."""
        if self._closed:
            raise RuntimeError("this BackgroundWriter is closed")
        self._raise_failed()
        start = time.perf_counter()
        try:
            while True:
                try:
                    self._queue.put((fn, args), timeout=0.05)
                    return
                except queue.Full:
                    self._raise_failed()
        finally:
            self.waited_s += time.perf_counter() - start

    def wait(self) -> None:
        """Block until every submitted job has run; raise a failed job's error."""
        start = time.perf_counter()
        self._queue.join()
        self.waited_s += time.perf_counter() - start
        self._raise_failed()

    def close(self, *, drain: bool = True) -> None:
        """Stop the thread. drain=True runs what is queued first (and raises its error);
        drain=False drops queued jobs (the one running still finishes)."""
        if self._closed:
            return
        self._closed = True
        if not drain:
            while True:
                try:
                    self._queue.get_nowait()
                    self._queue.task_done()
                except queue.Empty:
                    break
        start = time.perf_counter()
        self._queue.put(_STOP)
        self._thread.join()
        self.waited_s += time.perf_counter() - start
        if drain:
            self._raise_failed()

    def _raise_failed(self) -> None:
        if self._error is not None:  # every later call raises it again: the writer is done
            raise self._error

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # On the caller's own error, finish what was captured (it is valid), but do not let
        # a writer error hide the caller's.
        if exc_type is None:
            self.close(drain=True)
        else:
            try:
                self.close(drain=True)
            except BaseException:
                pass


class InlineWriter:
    """BackgroundWriter's interface, running each job at once on the caller's thread."""

    waited_s = 0.0
    thread_ids: tuple[int, ...] = ()  # no thread of its own

    def submit(self, fn: Callable, *args) -> None:
        fn(*args)

    def wait(self) -> None:
        pass

    def close(self, *, drain: bool = True) -> None:
        pass

    def __enter__(self) -> InlineWriter:
        return self

    def __exit__(self, *exc) -> None:
        pass


def start_writer(depth: int) -> BackgroundWriter | InlineWriter:
    """A writer thread with `depth` queued jobs at most, or inline writing for depth 0."""
    return BackgroundWriter(depth) if depth > 0 else InlineWriter()
