"""The dump protocol, as it runs inside an SGLang server process.

Imports only the standard library and torch: the patch bundle copies this file, and the server
imports it from there without Eyrie installed.

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
import uuid
from dataclasses import dataclass
from pathlib import Path

FORMAT = "eyrie-dump-1"
KEY_CHARS = 32
CHUNK_SUFFIX = ".safetensors"
ERROR_SUFFIX = ".error.json"
STATUS_PREFIX = "status-"
PREFIX_DIGITS = 10


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


# safetensors' names of the dtypes a chunk holds
_DTYPES = {"torch.bfloat16": "BF16", "torch.float16": "F16", "torch.float32": "F32",
           "torch.int64": "I64"}  # fmt: skip


def save_chunk(path: str | Path, tensors: dict, metadata: dict) -> None:
    """A chunk as a safetensors file (no pickle), written under a temporary name and renamed.

    Written here rather than with safetensors.torch.save_file, which first copies every tensor
    into one bytes object: this writes each tensor's bytes straight from its (pinned) buffer,
    one copy into the page cache, with the GIL released during each write. The layout is the
    format's own (8-byte header length, JSON header padded to 8 bytes, the tensors' bytes in
    header order); safetensors' reader reads it (tests/test_sglang_dump.py).
    """
    import torch  # the writing side only: the client reads with safetensors

    path = Path(path)
    header: dict = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    views, offset = [], 0
    for name, t in tensors.items():
        t = t.detach()
        if t.device.type != "cpu" or not t.is_contiguous():
            t = t.to("cpu").contiguous()
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": _DTYPES[str(t.dtype)],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        if size:
            views.append(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb", buffering=0) as f:
            _write_all(f, len(text).to_bytes(8, "little") + text)
            for view in views:
                _write_all(f, view)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_all(f, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[f.write(view) :]


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
