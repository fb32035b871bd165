"""An extract job's timings: seconds by step, as its outcome reports them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Timer:
    """Seconds by key (setup, capture, write, ..., total), from the job's start.

    `adding` may run on the job's thread and the writer's at once, each for its own key.
    """

    def __init__(self, keys):
        self.start = time.perf_counter()
        self.seconds = dict.fromkeys(keys, 0.0)

    @contextmanager
    def adding(self, key: str) -> Iterator[None]:
        """Add the body's time to `key` (not when the body raises: the job ends then)."""
        tick = time.perf_counter()
        yield
        self.seconds[key] += time.perf_counter() - tick

    def since_start(self, key: str) -> None:
        """Set `key` to the time since the job started."""
        self.seconds[key] = time.perf_counter() - self.start
