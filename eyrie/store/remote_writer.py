"""The writer process's side of eyrie/store/writer_process.py: a ShardWriter served over a pipe.

`python -m eyrie.store.remote_writer PARENT_PID MSG_FD FDS_FD` is started by the extract job.
It never imports torch (eyrie.store.format imports it only where a tensor is handed in), so it
is ready in about the time zarr takes to import. It asks the kernel to SIGKILL it when its
parent dies (PR_SET_PDEATHSIG), and checks that the parent still lives after asking: a killed
job never leaves a writer behind, so the store is at its last commit, as with a thread.

Messages are JSON, one per `Connection.send_bytes`; descriptors (the job's store lock, each
new shared slab) come over a second socket (SCM_RIGHTS), in the order the messages need them.
`store_group` is also what the job's writer thread runs: the two writers share one step.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
import traceback
from multiprocessing.connection import Connection

import numpy as np

from eyrie.store.format import StoreError, all_finite_bits, bf16_bits
from eyrie.store.lock import InheritedLock
from eyrie.store.slabs import Slab
from eyrie.store.writer import ShardWriter

PR_SET_PDEATHSIG = 1
PIECES = ("ids", "mask", "aux", "final")  # a sample's arrays in its slab, in row order


def store_group(writer, rows) -> dict:
    """Append a captured group's finite samples to `writer` and commit them.

    rows: (line, sample_id, input_ids, loss_mask, aux, final[, finite]), states as torch
    tensors or uint16 bf16 bit patterns; `finite`, when given, was found where the states were
    made (on the GPU, eyrie.extract.hf). The one step of both writers: on the job's writer
    thread, and in the writer process.
    """
    stored, stored_ids, non_finite, tokens = [], [], [], 0
    for line, sample_id, input_ids, loss_mask, aux, final, *known in rows:
        aux, final = (x if isinstance(x, np.ndarray) else bf16_bits(x) for x in (aux, final))
        # the bf16 patterns that are stored, checked as stored: all_finite_bits is far cheaper
        # than torch.isfinite on bf16 on a CPU, and it also catches a wider float whose
        # rounding to bf16 overflows
        finite = known[0] if known else all_finite_bits(aux) and all_finite_bits(final)
        if not finite:
            non_finite.append(line)
            continue
        # the captured buffers are never reused before the commit: handed over, not copied
        writer.append(sample_id, input_ids, loss_mask, aux, final, copy=False)
        stored.append(line)
        stored_ids.append(sample_id)
        tokens += len(input_ids)
    writer.commit()
    return {"stored": stored, "stored_ids": stored_ids, "non_finite": non_finite, "tokens": tokens}


def describe(exc: BaseException) -> dict:
    return {
        "type": type(exc).__name__,
        "module": type(exc).__module__,
        "message": str(exc),
        "errno": getattr(exc, "errno", None) if isinstance(exc, OSError) else None,
        "strerror": getattr(exc, "strerror", None),
        "filename": getattr(exc, "filename", None),
        "traceback": traceback.format_exc(),
    }


# ---------------------------------------------------------------------------------------------
# the writer process's side


def _die_with_parent(parent_pid: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # pragma: no cover - not Linux: memfd is not there either
        pass
    if os.getppid() != parent_pid:  # the parent died before the request was in place
        os._exit(1)


def serve(conn: Connection, fds: socket.socket) -> int:
    """The child's loop: open (with the lock), groups (with the slabs they bring), finish."""
    writer, slabs = None, {}

    def send(message: dict) -> None:
        conn.send_bytes(json.dumps(message).encode())

    try:
        while True:
            try:
                msg = json.loads(conn.recv_bytes())
            except EOFError:  # the job is gone: nothing more is committed
                return 1
            op = msg["op"]
            if op == "open":
                _, got, _, _ = socket.recv_fds(fds, 16, 1)
                lock = InheritedLock(msg["store"], got[0])
                writer = ShardWriter(msg["store"], lock=lock, **msg["kwargs"])
            elif op == "group":
                for old in msg["drop"]:
                    slabs.pop(old).close()
                if "new" in msg:
                    _, got, _, _ = socket.recv_fds(fds, 16, 1)
                    slabs[msg["slab"]] = Slab(msg["new"], fd=got[0])
                slab = slabs[msg["slab"]]
                rows = [
                    (it["line"], it["id"], *(slab.view(it[k]) for k in PIECES))
                    + ((it["finite"],) if it["finite"] is not None else ())
                    for it in msg["items"]
                ]
                tick = time.perf_counter()
                report = store_group(writer, rows)
                report["busy_s"] = time.perf_counter() - tick
                del rows
                send({"op": "done", **report, **_counts(writer)})
                continue
            elif op == "finish":
                writer.finish()
            elif op == "close":
                return 0
            else:
                raise StoreError(f"the writer process got an unknown message {op!r}")
            send({"op": op, **_counts(writer)})
    except BaseException as exc:
        try:
            send({"op": "failed", "error": describe(exc)})
        except OSError:
            pass
        return 1
    finally:
        if writer is not None:
            writer.close()


def _counts(writer) -> dict:
    return {"num_samples": writer.num_samples, "num_tokens": writer.num_tokens}


def main(argv: list[str]) -> int:
    parent_pid, msg_fd, fds_fd = (int(a) for a in argv)
    _die_with_parent(parent_pid)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return serve(Connection(msg_fd), socket.socket(fileno=fds_fd))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
