"""The forward thread on a CPU of its own while the writer works (``extract.pin_forward``).

Why: a target whose forward pass is short per token is bound by how fast one Python thread
launches its kernels, and the writer's threads (compression, checksums, fsync: the writer
process, or the job's writer thread) are free to be scheduled onto the CPU that thread runs
on. Pinned, the forward's thread keeps one CPU of those the job may use, and every writer
thread runs on the others; when the loop ends the job's thread gets all of them back.

Only threads are pinned, never beyond the CPUs the job was given (``os.sched_getaffinity``,
which a SLURM allocation or ``taskset`` sets): on a node shared with other jobs nothing is
taken from them.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path

from eyrie.common.errors import ExtractError

log = logging.getLogger("eyrie.extract.cpus")

AUTO_MIN_CPUS = 4  # auto pins only where the writer keeps at least 3 CPUs


def forward_cpu_plan(
    setting, *, writer_process: bool, device_type: str
) -> tuple[int, set[int]] | None:
    """(the forward thread's CPU, the writer's CPUs), or None when nothing is pinned.

    setting: extract.pin_forward. auto pins when the target runs on CUDA, the writer is a
    process of its own and the job may use at least AUTO_MIN_CPUS CPUs; true pins whenever
    two or more may be used (a target on the CPU then computes on that one CPU, less the
    threads its torch had already started).
    """
    if setting not in ("auto", True, False, None):
        raise ExtractError(f"extract.pin_forward: {setting!r}; use auto, true or false")
    if setting is False or not hasattr(os, "sched_setaffinity"):
        if setting is True:
            raise ExtractError(
                "extract.pin_forward: true needs Linux (sched_setaffinity); set it to auto or false"
            )
        return None
    allowed = os.sched_getaffinity(0)
    if setting in ("auto", None) and (
        device_type != "cuda" or not writer_process or len(allowed) < AUTO_MIN_CPUS
    ):
        return None
    if len(allowed) < 2:
        if setting is True:
            raise ExtractError(
                f"extract.pin_forward: true needs 2 CPUs or more; this job may use "
                f"{sorted(allowed)}; set it to auto or false"
            )
        return None
    cpu = min(allowed)
    return cpu, allowed - {cpu}


def threads_of(pid: int) -> list[int]:
    """The thread ids of process `pid` (Linux: /proc/PID/task)."""
    try:
        return [int(t) for t in os.listdir(Path("/proc") / str(pid) / "task")]
    except OSError:
        return []


def _set(tid: int, cpus: set[int]) -> None:
    try:
        os.sched_setaffinity(tid, cpus)
    except (ProcessLookupError, PermissionError):
        pass  # a thread that has just ended, or one we may not move: it stays where it is


@contextmanager
def forward_pinned(plan, *, writer_threads=(), writer_pids=()):
    """Run the body with the calling thread on plan's CPU and the writers on the rest.

    writer_threads: native ids of the job's own writer threads; writer_pids: writer processes
    (every thread they have now; those they start later inherit from their creator).
    """
    if plan is None:
        yield
        return
    cpu, others = plan
    allowed = os.sched_getaffinity(0)
    for tid in writer_threads:
        _set(tid, others)
    for pid in writer_pids:
        for tid in threads_of(pid):
            _set(tid, others)
    try:
        os.sched_setaffinity(0, {cpu})  # the calling thread only (Linux: per thread)
    except OSError as exc:  # the job's CPUs changed under it: run as it is, unpinned
        log.warning("extract.pin_forward: could not pin the forward to CPU %d (%s)", cpu, exc)
    else:
        log.info("forward pass pinned to CPU %d, writers on CPUs %s", cpu, sorted(others))
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)
