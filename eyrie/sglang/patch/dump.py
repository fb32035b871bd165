"""The dumper: one forward pass's hooked states become one chunk file per kept request.

Runs inside the server (see protocol.py for the files it writes): standard library and torch
only, relative imports. The forward's thread only stages and queues; a writer thread of its own
writes the files (handoff.py says why and how).
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .batch import (
    ChunkTracker,
    Segment,
    TensorParallel,
    batch_segments,
    first_tensor,
    layer_output,
    sglang_tensor_parallel,
)
from .handoff import HostCopy, HostPass, PassWriter, Timings
from .protocol import (
    FORMAT,
    STATUS_PREFIX,
    ProtocolError,
    Settings,
    chunk_name,
    compare_files,
    ensure_private_dir,
    error_name,
    save_chunk,
    sglang_package_dir,
    sglang_version,
    write_json_atomic,
)

STATUS_EVERY_S = 1.0  # how often a busy writer refreshes the status file's counters
QUEUE_PASSES = 4  # passes staged in pinned memory at most, waiting for a writer thread
WRITER_THREADS = 2

# ---------------------------------------------------------------------------------------------
# the dumper


@dataclass
class _Pass:
    batch: object
    segments: list[Segment]
    total: int
    staging: torch.Tensor | None = None  # (rows, k, H): our rows of each aux layer, on device
    aux_seen: set = field(default_factory=set)  # slots whose hook ran
    tp_flags: dict = field(default_factory=dict)  # what -> on-device "ranks disagree" flag
    errors: dict = field(default_factory=dict)  # rid -> (reason, detail)
    failed: tuple[str, str] | None = None  # a problem of the whole pass
    index: dict = field(default_factory=dict)  # device -> row index (when not all rows are ours)

    @property
    def rows(self) -> int:
        return sum(s.length for s in self.segments)


class Dumper:
    """Collects one pass's states from the hooks and writes one chunk file per kept request.

    Call `start(batch)` when a pass begins, `aux(slot, batch, output)` for each aux layer, then
    `final(output)` with the final norm's output. Problems never raise into SGLang's forward:
    they become error files the client stops on. The files are written by a thread of the
    dumper's own (`flush()` waits for it).
    """

    def __init__(self, settings: Settings, tp: TensorParallel | None = None, *, check=True):
        self.settings = settings
        self.slots = len(settings.aux_layer_ids)
        self.tracker = ChunkTracker()
        self._tp = tp if tp is not None else sglang_tensor_parallel()
        self._pass: _Pass | None = None
        self._problems: list[str] = []
        self.passes = 0
        self.chunks = 0
        self.timings = Timings()
        self._copy = HostCopy()
        self._writer = PassWriter(
            self.timings,
            QUEUE_PASSES,
            threads=WRITER_THREADS,
            on_error=self._writer_failed,
            on_idle=self._refresh,
        )
        self._status_at = 0.0
        self._status_counts: tuple = ()  # the counters the status file last showed
        ensure_private_dir(settings.dump_dir)
        package = sglang_package_dir()
        files = settings.manifest.get("sglang", {}).get("files", {})
        self._mismatch = compare_files(package.parent, files) if (check and package) else []
        if check and package is None:
            self._mismatch = ["sglang (not importable in this process)"]
        self._version = sglang_version(package)
        self._package = package
        self.write_status()
        if self._mismatch:
            raise RuntimeError(
                "eyrie capture patch: the SGLang in this process differs from the one verified "
                f"({settings.manifest.get('sglang', {}).get('version')}): "
                f"{', '.join(self._mismatch)}. Rerun verify_env and patch_server on this "
                "installation"
            )

    # -- status ---------------------------------------------------------------------------

    @property
    def tp(self) -> TensorParallel:
        return self._tp

    def write_status(self) -> None:
        s = self.settings
        tp = self._tp
        self._status_at = time.monotonic()
        self._status_counts = self._counts()
        write_json_atomic(
            s.dump_dir / f"{STATUS_PREFIX}{os.getpid()}.json",
            {
                "format": FORMAT,
                "pid": os.getpid(),
                "tp_rank": tp.rank,
                "tp_size": tp.size,
                "mechanism": s.mechanism,
                "manifest_sha256": s.manifest_sha256,
                "rid_prefix": s.rid_prefix,
                "sglang_version": self._version,
                "sglang_dir": str(self._package) if self._package else None,
                "files_ok": not self._mismatch,
                "mismatch": self._mismatch,
                "problems": self._problems,
                "passes": self.passes,
                "chunks": self.chunks,
                "timings": self.timings.as_dict(),
                "time": time.time(),
            },
        )

    def problem(self, message: str) -> None:
        """A problem not tied to one request: recorded once in the status file."""
        if message not in self._problems:
            self._problems.append(message)
            print(f"eyrie capture patch: {message}", file=sys.stderr, flush=True)
            try:
                self.write_status()
            except OSError:
                pass

    def _counts(self) -> tuple:
        return (self.passes, self.chunks, len(self._problems), self.timings.passes_written)

    def _refresh(self) -> None:
        """The idle writer's refresh: only when a counter moved since the file was written, so
        that a flushed, stopped dumper leaves its folder alone."""
        if self._counts() == self._status_counts:
            return
        try:
            self.write_status()
        except OSError:
            pass

    def flush(self, timeout: float = 60.0) -> bool:
        """Wait until every pass handed to the writer is written; the status file refreshed."""
        done = self._writer.flush(timeout)
        self.write_status()
        return done

    @contextmanager
    def _timed(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings.add("hooks_s", time.perf_counter() - t0)

    # -- the pass (on the forward's thread) -------------------------------------------------

    def start(self, batch) -> None:
        with self._timed():
            self._start(batch)

    def _start(self, batch) -> None:
        if self._pass is not None:
            self._fail(self._pass, "no_final", "the final-norm hook did not run for this pass")
            self._finish_errors(self._pass)
            self._pass = None
        if batch is None:
            self.problem("a layer hook found no ForwardBatch among its positional inputs")
            return
        try:
            segments, total = batch_segments(batch, self.settings.rid_prefix)
        except ProtocolError as exc:
            rids = getattr(batch, "rids", None)
            if rids is None:
                self.problem(str(exc))
            else:
                self._write_errors({r: ("bad_batch", str(exc)) for r in rids if self._ours(r)})
            return
        if not segments:
            return
        p = _Pass(batch, segments, total)
        for s in segments:
            err = self.tracker.check(s.rid, s.prefix, s.length)
            if err:
                p.errors[s.rid] = err
        self._pass = p

    def _ours(self, rid) -> bool:
        return isinstance(rid, str) and rid.startswith(self.settings.rid_prefix)

    def abort(self, exc: BaseException) -> None:
        """An unexpected error inside a hook: the pass's requests get an error file."""
        p, self._pass = self._pass, None
        detail = f"{type(exc).__name__}: {exc}"
        self.problem(f"a hook raised {detail}")
        if p is not None:
            self._fail(p, "hook_error", detail)
            self._finish_errors(p)

    def _current(self, batch) -> _Pass | None:
        p = self._pass
        if p is None or p.batch is not batch:
            self._start(batch)
            p = self._pass
        return p

    def _fail(self, p: _Pass, reason: str, detail: str) -> None:
        if p.failed is None:
            p.failed = (reason, detail)

    def _rows(self, p: _Pass, t: torch.Tensor) -> torch.Tensor:
        """Our rows of a pass-sized tensor, on its device: `t` itself when every row is ours."""
        if p.rows == p.total:
            return t
        idx = p.index.get(t.device)
        if idx is None:
            idx = torch.cat([torch.arange(s.start, s.start + s.length) for s in p.segments])
            p.index[t.device] = idx = idx.to(t.device)
        return t.index_select(0, idx)

    def _check_rows(self, p: _Pass, t: torch.Tensor, what: str, pending: bool) -> bool:
        if p.failed:
            return False
        if t.dim() != 2 or t.shape[0] != p.total:
            self._fail(
                p,
                "shape",
                f"{what} has shape {tuple(t.shape)}; the pass has {p.total} tokens",
            )
            return False
        if pending:
            self._fail(
                p,
                "not_all_reduced",
                f"{what}: SGLang left this layer's all-reduce to the next layer, so each "
                "tensor-parallel rank holds a partial sum; start the server with "
                "--enforce-disable-flashinfer-allreduce-fusion",
            )
            return False
        flag = self.tp.disagreement(t)  # every rank joins; read by the writer, not here
        if flag is not None:
            p.tp_flags[what] = flag
        return True

    def aux(self, slot: int, batch, output) -> None:
        """A hook on aux layer `slot` (the slot-th configured aux id) saw `output`."""
        with self._timed():
            self._aux(slot, batch, output)

    def _aux(self, slot: int, batch, output) -> None:
        p = self._current(batch)
        if p is None:
            return
        try:
            t, pending = layer_output(output)
        except ProtocolError as exc:
            self._fail(p, "bad_output", str(exc))
            return
        if slot in p.aux_seen:
            self._fail(p, "hook_twice", f"the hook of aux slot {slot} fired twice in one pass")
            return
        p.aux_seen.add(slot)
        if self._check_rows(p, t, f"aux layer {self.settings.aux_layer_ids[slot]}", pending):
            if self.tp.rank != 0:
                return
            if p.staging is None:
                shape = (p.rows, self.slots, t.shape[1])
                p.staging = torch.empty(shape, dtype=t.dtype, device=t.device)
            p.staging[:, slot].copy_(self._rows(p, t))

    def final(self, output) -> None:
        """The final norm's output: the end of the pass; hands the pass to the writer."""
        with self._timed():
            self._final(output)

    def _final(self, output) -> None:
        p, self._pass = self._pass, None
        if p is None:
            return
        try:
            t = first_tensor(output)
        except ProtocolError as exc:
            self._fail(p, "bad_output", str(exc))
            t = None
        missing = [self.settings.aux_layer_ids[j] for j in range(self.slots) if j not in p.aux_seen]
        if missing and not p.failed:
            self._fail(
                p,
                "missing_layers",
                f"no state of aux layers {missing} in this pass: their hooks did not run",
            )
        self.passes += 1
        if t is None or not self._check_rows(p, t, "the final state", False):
            self._finish_errors(p)
            return
        if self.tp.rank != 0:
            return
        if p.failed or p.staging is None:
            self._finish_errors(p)
            return
        host = self._copy.to_host(p.staging, *self._own_rows(p, t), flags=p.tp_flags)
        host.write, host.tag = self._write_pass, p
        self._writer.put(host)

    def _own_rows(self, p: _Pass, final: torch.Tensor) -> tuple:
        """(final, input ids, positions) of our rows, as tensors of our own: the writer reads
        them after SGLang has moved on and may have reused its buffers."""
        out = []
        batch = p.batch
        for t, dtype in (
            (final, final.dtype),
            (getattr(batch, "input_ids", None), torch.int64),
            (getattr(batch, "positions", None), torch.int64),
        ):
            if t is not final and not _flat(t, p.total):
                out.append(None)
                continue
            rows = self._rows(p, t)
            out.append(rows.to(dtype, copy=rows is t))
        return tuple(out)

    def capture_pass(self, batch, aux_states, final_state) -> None:
        """All of a pass at once (the import hook's path): aux states in ascending layer order."""
        self.start(batch)
        p = self._pass
        if p is None:
            return
        if aux_states is None or len(aux_states) != self.slots:
            got = "none" if aux_states is None else len(aux_states)
            self._fail(
                p,
                "missing_layers",
                f"the model returned {got} aux states for {self.slots} aux layers; "
                "set_eagle3_layers_to_capture did not reach the layers' holder",
            )
        else:
            order = sorted(range(self.slots), key=lambda j: self.settings.aux_layer_ids[j])
            for slot, state in zip(order, aux_states, strict=True):
                self.aux(slot, batch, state)
        self.final(final_state)

    # -- writing (on the writer's thread) ---------------------------------------------------

    def _write_pass(self, host: HostPass) -> None:
        p = host.tag
        disagree = [what for what, flag in host.flags.items() if bool(flag)]
        if disagree:
            self._fail(
                p,
                "tp_disagree",
                f"{disagree[0]} differs between tensor-parallel ranks (not all-reduced yet); "
                "capture it with tp 1 or with the fusion of all-reduces turned off",
            )
        else:
            self._write_chunks(p, host)
        self._finish_errors(p)
        if time.monotonic() - self._status_at > STATUS_EVERY_S:
            self.write_status()

    def _write_chunks(self, p: _Pass, host: HostPass) -> None:
        s0 = self.settings
        at = 0
        for seg in p.segments:
            a, b = at, at + seg.length
            at = b
            if seg.rid in p.errors:
                continue
            tensors = {"aux": host.aux[a:b], "final": host.final[a:b]}
            if host.ids is not None:
                tensors["input_ids"] = host.ids[a:b]
            if host.positions is not None:
                tensors["positions"] = host.positions[a:b]
            meta = {
                "format": FORMAT,
                "rid": seg.rid,
                "prefix": seg.prefix,
                "tokens": seg.length,
                "aux_layer_ids": json.dumps(s0.aux_layer_ids),
                "mechanism": s0.mechanism,
                "manifest_sha256": s0.manifest_sha256,
                "tp_size": self.tp.size,
                "pid": os.getpid(),
            }
            try:
                save_chunk(s0.dump_dir / chunk_name(seg.rid, seg.prefix), tensors, meta)
                self.chunks += 1
            except OSError as exc:
                p.errors[seg.rid] = ("write_failed", f"{s0.dump_dir}: {exc}")

    def _writer_failed(self, host: HostPass, exc: BaseException) -> None:
        """The writer thread hit an unexpected error: the pass's requests are told."""
        self.problem(f"the dump writer raised {type(exc).__name__}: {exc}")
        if isinstance(host.tag, _Pass):
            self._fail(host.tag, "write_failed", f"{type(exc).__name__}: {exc}")
            self._finish_errors(host.tag)

    def _finish_errors(self, p: _Pass) -> None:
        errors = dict(p.errors)
        if p.failed:
            errors.update({s.rid: p.failed for s in p.segments})
        self._write_errors(errors)

    def _write_errors(self, errors: dict) -> None:
        if not errors or self.tp.rank != 0:
            return
        for rid, (reason, detail) in errors.items():
            try:
                write_json_atomic(
                    self.settings.dump_dir / error_name(rid),
                    {"rid": rid, "reason": reason, "detail": detail, "pid": os.getpid()},
                )
            except OSError as exc:
                self.problem(f"cannot write an error file into {self.settings.dump_dir}: {exc}")


def _flat(t, total: int) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() == 1 and t.shape[0] == total
