"""The dump protocol, as it runs inside an SGLang server process.

Imports only the standard library, torch and safetensors: the patch bundle copies this file, and
the server imports it from there without Eyrie installed.

One forward pass in EXTEND mode holds the prompt tokens of several requests, one after another
on the token axis: request j has `extend_seq_lens_cpu[j]` rows, which are its tokens from
`extend_prefix_lens_cpu[j]` on (chunked prefill cuts a long prompt into several passes). Only
requests whose rid starts with the workflow's prefix are kept; health checks and the server's
warm-up request are prefills too and are ignored. For each kept request the pass's rows become
one chunk file; the client joins a request's chunks by their prefix length.

Files in the dump folder (names are safe whatever the rid holds):
- `<key>.<prefix, 10 digits>.safetensors`: one chunk. Tensors `aux` (n, k, H) in the order of
  the configured aux ids, `final` (n, H), `input_ids` (n,) and `positions` (n,) int64; metadata
  `rid`, `prefix`, `tokens` and where it was written. key = sha256(rid)[:32].
- `<key>.error.json`: the request cannot be dumped correctly (a radix-cache prefix hit, a gap
  between chunks, a layer output not yet all-reduced, ...); the client stops on it.
- `status-<pid>.json`: written when the patch loads in a server process; problems seen later
  (a hook that finds no ForwardBatch, say) are added to it.
Every file is written under a name starting with "." and renamed into place, so a reader never
sees half a file. Only tensor-parallel rank 0 writes chunks and errors.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

FORMAT = "eyrie-dump-1"
KEY_CHARS = 32
CHUNK_SUFFIX = ".safetensors"
ERROR_SUFFIX = ".error.json"
STATUS_PREFIX = "status-"
PREFIX_DIGITS = 10
# Tolerance of the cross-rank check: replicated states agree to the bit; partial sums of an
# all-reduce that has not happened yet differ by their own size.
TP_RTOL = 1e-3


class ProtocolError(RuntimeError):
    """The server's batch does not have the shape the protocol relies on."""


# ---------------------------------------------------------------------------------------------
# names


def rid_key(rid: str) -> str:
    return hashlib.sha256(rid.encode("utf-8")).hexdigest()[:KEY_CHARS]


def chunk_name(rid: str, prefix: int) -> str:
    return f"{rid_key(rid)}.{int(prefix):0{PREFIX_DIGITS}d}{CHUNK_SUFFIX}"


def error_name(rid: str) -> str:
    return f"{rid_key(rid)}{ERROR_SUFFIX}"


def parse_chunk_name(name: str) -> tuple[str, int] | None:
    """(key, prefix) of a chunk file name; None for any other name."""
    if name.startswith(".") or not name.endswith(CHUNK_SUFFIX):
        return None
    key, _, prefix = name[: -len(CHUNK_SUFFIX)].partition(".")
    if len(key) != KEY_CHARS or len(prefix) != PREFIX_DIGITS or not prefix.isdigit():
        return None
    return key, int(prefix)


# ---------------------------------------------------------------------------------------------
# files


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def write_json_atomic(path: str | Path, obj: dict) -> None:
    path = Path(path)
    tmp = _tmp_name(path)
    try:
        tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_chunk(path: str | Path, tensors: dict, metadata: dict) -> None:
    """A chunk as safetensors (no pickle), written under a temporary name and renamed."""
    from safetensors.torch import save_file

    path = Path(path)
    tmp = _tmp_name(path)
    try:
        save_file(
            {k: v.detach().contiguous() for k, v in tensors.items()},
            str(tmp),
            metadata={k: str(v) for k, v in metadata.items()},
        )
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def ensure_private_dir(path: str | Path) -> Path:
    """The dump folder, created with mode 0700; an existing one must be ours and private."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise PermissionError(
            f"dump folder {path} belongs to another user; choose a folder of your own"
        )
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


# ---------------------------------------------------------------------------------------------
# the installed SGLang, as this process sees it


def sglang_package_dir() -> Path | None:
    """The sglang package folder: the imported one, else where an import would find it."""
    mod = sys.modules.get("sglang")
    paths = list(getattr(mod, "__path__", []) or []) if mod is not None else []
    if not paths:
        try:
            spec = importlib.util.find_spec("sglang")
        except (ImportError, ValueError):
            spec = None
        paths = list(spec.submodule_search_locations or []) if spec else []
    return Path(paths[0]) if paths else None


def sglang_version(package: Path | None) -> str:
    mod = sys.modules.get("sglang")
    if getattr(mod, "__version__", None):
        return str(mod.__version__)
    if package is not None and (package / "version.py").is_file():
        for line in (package / "version.py").read_text().splitlines():
            if line.startswith("__version__"):
                return line.split("=", 1)[1].strip().strip("\"'")
    return "unknown"


def compare_files(root: Path, files: dict[str, str]) -> list[str]:
    """Files (relative to the folder above sglang/) that differ from the recorded sha256."""
    bad = []
    for rel, digest in sorted(files.items()):
        p = root / rel
        if not p.is_file():
            bad.append(f"{rel} (missing)")
        elif sha256_file(p) != digest:
            bad.append(f"{rel} (changed)")
    return bad


# ---------------------------------------------------------------------------------------------
# settings


@dataclass
class Settings:
    """What the server-side code needs: the bundle's manifest and this server's dump folder."""

    manifest: dict
    manifest_sha256: str
    dump_dir: Path
    rid_prefix: str
    mechanism: str

    @property
    def aux_layer_ids(self) -> list[int]:
        return [int(i) for i in self.manifest["aux_layer_ids"]]


def load_settings(
    manifest_path: str | Path,
    *,
    dump_dir: str | None = None,
    rid_prefix: str | None = None,
    mechanism: str | None = None,
) -> Settings:
    manifest_path = Path(manifest_path)
    raw = manifest_path.read_bytes()
    manifest = json.loads(raw)
    dump = dump_dir or manifest.get("dump_dir")
    if not dump:
        raise ValueError(
            f"no dump folder: {manifest_path} has none and the server was given none "
            "(hook config 'dump_dir' or EYRIE_PATCH_DUMP_DIR)"
        )
    return Settings(
        manifest=manifest,
        manifest_sha256=hashlib.sha256(raw).hexdigest(),
        dump_dir=Path(dump),
        rid_prefix=rid_prefix or manifest.get("rid_prefix") or "eyrie-",
        mechanism=mechanism or manifest.get("mechanism", "unknown"),
    )


# ---------------------------------------------------------------------------------------------
# the batch


@dataclass
class Segment:
    rid: str
    start: int  # first row of this request in the pass
    length: int  # rows (tokens) of this request in the pass
    prefix: int  # tokens of this request before this pass


def _ints(values) -> list[int] | None:
    if values is None:
        return None
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [int(v) for v in values]


def is_extend(batch) -> bool:
    mode = getattr(batch, "forward_mode", None)
    check = getattr(mode, "is_extend", None)
    return bool(check()) if callable(check) else False


def batch_segments(batch, rid_prefix: str) -> tuple[list[Segment], int]:
    """Our requests in an EXTEND pass and the pass's token count; ([], 0) for other passes."""
    if batch is None or not is_extend(batch):
        return [], 0
    rids = getattr(batch, "rids", None)
    if rids is None:
        raise ProtocolError(
            "the ForwardBatch carries no rids, so requests cannot be told apart; this release "
            "needs the import_hook mechanism, which adds them"
        )
    rids = list(rids)
    if not any(isinstance(r, str) and r.startswith(rid_prefix) for r in rids):
        return [], 0
    seq = _ints(getattr(batch, "extend_seq_lens_cpu", None))
    pre = _ints(getattr(batch, "extend_prefix_lens_cpu", None))
    if seq is None or pre is None or len(seq) != len(rids) or len(pre) != len(rids):
        raise ProtocolError(
            f"an EXTEND pass with {len(rids)} rids has extend_seq_lens_cpu={seq} and "
            f"extend_prefix_lens_cpu={pre}; both must list one length per request"
        )
    out, start = [], 0
    for rid, n, p in zip(rids, seq, pre, strict=True):
        if isinstance(rid, str) and rid.startswith(rid_prefix) and n > 0:
            out.append(Segment(rid, start, n, p))
        start += n
    return out, start


def find_batch(args, kwargs=None):
    """The ForwardBatch among a module's inputs (found by what it has, not by its class)."""
    for value in list(args) + list((kwargs or {}).values()):
        if hasattr(value, "forward_mode") and hasattr(value, "extend_seq_lens_cpu"):
            return value
    return None


def first_tensor(output) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise ProtocolError(f"a hooked module returned {type(output).__name__}, not a tensor")


def layer_output(output) -> tuple[torch.Tensor, bool]:
    """(the output of a decoder layer, whether SGLang left its all-reduce to the next layer).

    SGLang's decoder layers return (hidden_states, residual, ...) with the residual add fused
    into the next norm, so the layer's output is their sum.
    """
    hidden = first_tensor(output)
    pending = bool(getattr(hidden, "_sglang_needs_allreduce_fusion", False))
    if isinstance(output, (tuple, list)) and len(output) > 1:
        residual = output[1]
        if isinstance(residual, torch.Tensor):
            return hidden + residual, pending
    return hidden, pending


# ---------------------------------------------------------------------------------------------
# chunk order


class ChunkTracker:
    """The next expected prefix length of each request, to catch radix-cache hits and gaps."""

    def __init__(self, limit: int = 1 << 16):
        self._next: OrderedDict[str, int] = OrderedDict()
        self.limit = limit

    def check(self, rid: str, prefix: int, length: int) -> tuple[str, str] | None:
        expected = self._next.get(rid)
        if prefix == 0:
            self._next[rid] = length
        elif expected is None:
            return (
                "radix_prefix_hit",
                f"its first pass starts at token {prefix}: the server took the first {prefix} "
                "tokens from its prefix cache, so their states were never computed here. Start "
                "the server with --disable-radix-cache",
            )
        elif expected != prefix:
            return (
                "chunk_gap",
                f"a pass starts at token {prefix} but the previous one ended at {expected}",
            )
        else:
            self._next[rid] = prefix + length
        self._next.move_to_end(rid)
        while len(self._next) > self.limit:
            self._next.popitem(last=False)
        return None


# ---------------------------------------------------------------------------------------------
# tensor parallelism


@dataclass
class TensorParallel:
    """This process's tensor-parallel rank, and how to gather a small tensor from every rank."""

    rank: int = 0
    size: int = 1
    gather: Callable[[torch.Tensor], list[torch.Tensor]] | None = None

    def agree(self, rows: torch.Tensor) -> bool:
        """Whether every rank holds the same rows (checked on a per-row fingerprint)."""
        if self.size <= 1 or self.gather is None:
            return True
        fingerprint = rows.float().sum(dim=-1)
        parts = self.gather(fingerprint)
        scale = float(parts[0].abs().max()) if parts[0].numel() else 0.0
        atol = TP_RTOL * max(scale, 1.0)
        return all(torch.allclose(p, parts[0], rtol=TP_RTOL, atol=atol) for p in parts[1:])


def sglang_tensor_parallel() -> TensorParallel:
    """The rank and group of SGLang's tensor-parallel world; rank 0 of 1 outside a server.

    Only asked of an SGLang already imported (a server has set up its groups before it builds
    the model); importing SGLang here would be slow and could fail outside a server.
    """
    dist = sys.modules.get("sglang.srt.distributed")
    if dist is None:
        return TensorParallel()
    try:
        size = int(dist.get_tensor_model_parallel_world_size())
        rank = int(dist.get_tensor_model_parallel_rank())
        get_tp_group = dist.get_tp_group
    except Exception:  # distributed not set up in this process
        return TensorParallel()
    if size <= 1:
        return TensorParallel(rank, 1)
    group = get_tp_group().device_group

    def gather(t: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(t) for _ in range(size)]
        torch.distributed.all_gather(out, t.contiguous(), group=group)
        return out

    return TensorParallel(rank, size, gather)


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
