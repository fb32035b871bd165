"""The dumper: one forward pass's hooked states become one chunk file per kept request.

Runs inside the server (see protocol.py for the files it writes): standard library, torch and
safetensors only, relative imports.
"""

from __future__ import annotations

import json
import os
import sys
import time
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

# ---------------------------------------------------------------------------------------------
# the dumper


@dataclass
class _Pass:
    batch: object
    segments: list[Segment]
    total: int
    aux: dict = field(default_factory=dict)  # slot -> our rows, on the CPU
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
    they become error files the client stops on.
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

    # -- the pass -------------------------------------------------------------------------

    def start(self, batch) -> None:
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
            self.start(batch)
            p = self._pass
        return p

    def _fail(self, p: _Pass, reason: str, detail: str) -> None:
        if p.failed is None:
            p.failed = (reason, detail)

    def _rows(self, p: _Pass, t: torch.Tensor) -> torch.Tensor | None:
        """Our rows of a pass-sized tensor, on the CPU (rank 0 only; None elsewhere)."""
        if self.tp.rank != 0:
            return None
        if p.rows == p.total:
            picked = t
        else:
            idx = p.index.get(t.device)
            if idx is None:
                idx = torch.cat([torch.arange(s.start, s.start + s.length) for s in p.segments]).to(
                    t.device
                )
                p.index[t.device] = idx
            picked = t.index_select(0, idx)
        return picked.detach().to("cpu")

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
        if self.tp.size > 1 and not self.tp.agree(t):
            self._fail(
                p,
                "tp_disagree",
                f"{what} differs between tensor-parallel ranks (not all-reduced yet); "
                "capture it with tp 1 or with the fusion of all-reduces turned off",
            )
            return False
        return True

    def aux(self, slot: int, batch, output) -> None:
        """A hook on aux layer `slot` (the slot-th configured aux id) saw `output`."""
        p = self._current(batch)
        if p is None:
            return
        try:
            t, pending = layer_output(output)
        except ProtocolError as exc:
            self._fail(p, "bad_output", str(exc))
            return
        if slot in p.aux:
            self._fail(p, "hook_twice", f"the hook of aux slot {slot} fired twice in one pass")
            return
        if self._check_rows(p, t, f"aux layer {self.settings.aux_layer_ids[slot]}", pending):
            p.aux[slot] = self._rows(p, t)

    def final(self, output) -> None:
        """The final norm's output: the end of the pass; writes the chunks."""
        p, self._pass = self._pass, None
        if p is None:
            return
        try:
            t = first_tensor(output)
        except ProtocolError as exc:
            self._fail(p, "bad_output", str(exc))
            t = None
        missing = [self.settings.aux_layer_ids[j] for j in range(self.slots) if j not in p.aux]
        if missing and not p.failed:
            self._fail(
                p,
                "missing_layers",
                f"no state of aux layers {missing} in this pass: their hooks did not run",
            )
        if t is not None and self._check_rows(p, t, "the final state", False):
            final = self._rows(p, t)
            if self.tp.rank == 0:
                self._write_chunks(p, final)
        self.passes += 1
        self._finish_errors(p)

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

    # -- writing --------------------------------------------------------------------------

    def _write_chunks(self, p: _Pass, final: torch.Tensor) -> None:
        if p.failed:
            return
        s0 = self.settings
        batch = p.batch
        ids = getattr(batch, "input_ids", None)
        pos = getattr(batch, "positions", None)
        ids = self._rows(p, ids.reshape(-1, 1))[:, 0] if _flat(ids, p.total) else None
        pos = self._rows(p, pos.reshape(-1, 1))[:, 0] if _flat(pos, p.total) else None
        aux = torch.stack([p.aux[j] for j in range(self.slots)], dim=1)
        at = 0
        for seg in p.segments:
            a, b = at, at + seg.length
            at = b
            if seg.rid in p.errors:
                continue
            tensors = {"aux": aux[a:b].clone(), "final": final[a:b].clone()}
            if ids is not None:
                tensors["input_ids"] = ids[a:b].to(torch.int64).clone()
            if pos is not None:
                tensors["positions"] = pos[a:b].to(torch.int64).clone()
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
