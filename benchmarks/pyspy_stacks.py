"""py-spy on an SGLang server's scheduler during benchmark passes, and its stacks tallied.

Used by benchmarks/sglang_capture_overhead.py --py-spy: any release of the capture patch (the
older ones too) can be sampled, with no change to the server.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path


def scheduler_pid(server) -> int | None:
    """The pid of SGLang's scheduler process (its title: sglang::scheduler) under a server; the
    server's own pid where it has none (the stand-in runs its passes in-process)."""
    group = server.proc.pid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != group:
                continue
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ProcessLookupError):
            continue
        if "scheduler" in title:
            return int(entry.name)
    return group


@contextmanager
def py_spy(binary: str | None, pid: int | None, out: Path):
    """py-spy sampling `pid` (all threads, idle ones too) while the block runs; raw stacks."""
    if not binary or not pid:
        yield None
        return
    cmd = [binary, "record", "--pid", str(pid), "--rate", "200", "--format", "raw", "--idle",
           "--threads", "--nonblocking", "--output", str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # attached before the timed passes start
    try:
        yield out
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            err = b"py-spy did not stop"
        if proc.returncode not in (0, -signal.SIGINT) and not out.exists():
            print(f"py-spy failed ({proc.returncode}): {err.decode()[-500:]}", flush=True)


def tally_stacks(path: Path | None, top: int = 6) -> dict | None:
    """Per thread of the sampled process, from py-spy's raw output: the share of samples whose
    stack holds a frame of the patch (eyrie_sglang_patch), the patch's innermost frames and the
    leaf frames, most frequent first; threads with the most patch samples first."""
    if path is None or not path.exists():
        return None
    leaves: dict = collections.defaultdict(collections.Counter)
    patch: dict = collections.defaultdict(collections.Counter)
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit() or not stack:
            continue
        frames = stack.split(";")
        leaves[frames[0]][frames[-1]] += int(count)
        ours = [f for f in frames if "eyrie_sglang_patch" in f]
        if ours:
            patch[frames[0]][ours[-1]] += int(count)
    order = sorted(leaves, key=lambda t: -sum(patch[t].values()))
    out = {}
    for thread in order[:top]:
        total = sum(leaves[thread].values())
        out[thread] = {
            "samples": total,
            "in_patch": round(sum(patch[thread].values()) / total, 4),
            "patch_frames": [(f, round(n / total, 4)) for f, n in patch[thread].most_common(4)],
            "top_leaves": [(f, round(n / total, 4)) for f, n in leaves[thread].most_common(4)],
        }
    return out or None
