"""The shard store's format in code: names, versions, bf16 bit patterns and durable writes.

docs/store-format.md is the contract; this module holds the pieces of it that the writer
(eyrie/store/writer.py) and the reader (eyrie/store/reader.py) share, so the two cannot drift:
the array names, the commit record and its checks, and the fsync rules of the commit protocol.

- Samples are ragged, so every per-token array shares one flat token axis and ``offsets``
  (n + 1 int64) marks where each sample starts and ends.
- Zarr has no bfloat16, so hidden states are stored as their raw 16-bit patterns (uint16);
  ``bf16_bits`` and ``from_bf16_bits`` convert without touching a single bit.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from eyrie.common.errors import EyrieError

if TYPE_CHECKING:
    import torch


def is_tensor(x) -> bool:
    """Whether x is a torch tensor, without importing torch: a process that never imported it
    (the writer process, eyrie/store/remote_writer.py) holds none, and starts faster."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


STORE_VERSION = 1
COMMIT_RECORD = "commit.json"
TOKEN_ARRAYS = ("input_ids", "loss_mask", "aux_hidden", "final_hidden")
SAMPLE_ARRAYS = ("offsets", "sample_id")
ALL_ARRAYS = TOKEN_ARRAYS + SAMPLE_ARRAYS


def committed_lengths(n: int, t: int) -> dict[str, int]:
    """Each array's length for n samples of t tokens (offsets has one entry more)."""
    return {"offsets": n + 1, "sample_id": n, **dict.fromkeys(TOKEN_ARRAYS, t)}


OUR_TMP = ".eyrie-tmp"  # suffix of the store's own temp files (resume deletes them)
ZARR_TMP = re.compile(r"\.[0-9a-f]{32}\.partial$")  # zarr's LocalStore temp names


class StoreError(EyrieError, RuntimeError):
    """A store that cannot be written or read as asked; the message names the store and the fix."""


# ---------------------------------------------------------------------------------------------
# bfloat16 <-> uint16 bit patterns


def bf16_bits(t: torch.Tensor) -> np.ndarray:
    """The raw 16-bit patterns of a bfloat16 tensor as uint16 (floats are cast to bf16 first).

    The result shares memory with ``t`` when ``t`` is already a contiguous CPU bf16 tensor.
    """
    if not is_tensor(t):
        raise TypeError(f"bf16_bits takes a torch.Tensor, got {type(t).__name__}")
    import torch

    if t.dtype != torch.bfloat16:
        if not t.is_floating_point():
            raise TypeError(f"bf16_bits takes a floating-point tensor, got {t.dtype}")
        t = t.to(torch.bfloat16)
    return t.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)


def all_finite_bits(bits: np.ndarray) -> bool:
    """Whether every bfloat16 pattern in a uint16 array is a finite value (no Inf, no NaN).

    A bfloat16 is non-finite iff its 8 exponent bits are all ones: patterns 0x7F80-0x7FFF
    (+Inf, positive NaNs) and 0xFF80-0xFFFF (-Inf, negative NaNs). Those are the top of the
    int16 range and the top of the uint16 range, so two max reductions over the patterns
    decide it, with no temporary array: about 30x faster than ``torch.isfinite`` on the bf16
    tensor on a CPU (which widens every value), and extraction checks every state it stores.
    """
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError(f"all_finite_bits takes uint16 bf16 bit patterns, got {bits.dtype}")
    if bits.size == 0:
        return True
    return bool(bits.max() < 0xFF80 and bits.view(np.int16).max() < 0x7F80)


def from_bf16_bits(a: np.ndarray) -> torch.Tensor:
    """A bfloat16 tensor from uint16 bit patterns, bit for bit (the inverse of bf16_bits)."""
    a = np.asarray(a)
    if a.dtype != np.uint16:
        raise TypeError(f"from_bf16_bits takes a uint16 array, got {a.dtype}")
    if not (a.flags.c_contiguous and a.flags.writeable):
        a = np.ascontiguousarray(a).copy()
    import torch

    return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)


def int_vector(x, name: str, who: str, allow_bool: bool = False) -> np.ndarray:
    """A sample's 1-D integer (or bool) field as an ndarray; StoreError naming it otherwise."""
    if is_tensor(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    ok = np.issubdtype(a.dtype, np.integer) or (allow_bool and a.dtype == np.bool_)
    if not ok:
        raise StoreError(f"{who}: {name} must be an integer array, got dtype {a.dtype}")
    if a.ndim != 1:
        raise StoreError(f"{who}: {name} must be 1-D (tokens,), got shape {a.shape}")
    return a


def input_bits(x, name: str, shape: tuple, who: str) -> tuple[np.ndarray, bool]:
    """uint16 bf16 bit patterns (floats rounded to bf16), and whether they are a new array."""
    if isinstance(x, np.ndarray) and x.dtype == np.uint16:
        bits, fresh = x, False
    elif is_tensor(x) and x.is_floating_point():
        bits = bf16_bits(x)
        fresh = not _shares_memory(bits, x)
    elif isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating):
        import torch

        bits, fresh = bf16_bits(torch.from_numpy(np.ascontiguousarray(x))), True
    else:
        dtype = getattr(x, "dtype", type(x).__name__)
        raise StoreError(
            f"{who}: {name} must be a floating tensor (bf16 preferred) or a uint16 array "
            f"of bf16 bits, got {dtype}"
        )
    if tuple(bits.shape) != shape:
        raise StoreError(f"{who}: {name} must have shape {shape}, got {tuple(bits.shape)}")
    return bits, fresh


def _shares_memory(bits: np.ndarray, t: torch.Tensor) -> bool:
    """Whether bf16_bits(t) is a view of t's own memory (a contiguous CPU bf16 tensor)."""
    if t.device.type != "cpu" or bits.size == 0:
        return t.device.type == "cpu"
    lo = t.untyped_storage().data_ptr()
    return lo <= bits.ctypes.data < lo + t.untyped_storage().nbytes()


# ---------------------------------------------------------------------------------------------
# small helpers


def json_normal(obj: Any, what: str, path: Path) -> Any:
    """obj as it reads back from JSON (tuples become lists); StoreError if it is not JSON."""
    try:
        return json.loads(json.dumps(obj, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise StoreError(
            f"{path}: {what} must be plain JSON (dicts, lists, str, int, float, bool, None): "
            f"{exc}. Convert the offending values to strings before passing them."
        ) from None


def ids_digest(ids: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()


def read_json(p: Path) -> dict:
    with open(p, encoding="utf-8") as f:
        return json.load(f)


def write_json_durable(p: Path, obj: dict) -> None:
    """Write to a temp name in the same folder, fsync it, os.replace, fsync the folder.

    Like eyrie.common.atomic.write_json, but the temp name ends in ``.eyrie-tmp``: the store
    format names that suffix as the one a resuming writer deletes (docs/store-format.md), and
    the JSON has no trailing newline, so the commit record stays byte for byte as it was.
    """
    tmp = p.with_name(f"{p.name}.{uuid.uuid4().hex}{OUR_TMP}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        fsync(p.parent)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_durable(p: Path, pieces: Sequence[bytes]) -> None:
    """Write the pieces, in order, to a temp name beside p (``.eyrie-tmp``), fsync, os.replace.

    The folder is not fsynced here: a commit fsyncs the folders of all its files once, after
    every file (``fsync_tree``). The temp name is one a resuming writer deletes.
    """
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f"{p.name}.{uuid.uuid4().hex}{OUR_TMP}")
    try:
        with open(tmp, "wb") as f:
            for piece in pieces:
                f.write(piece)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)


def root_attrs(path: Path) -> dict | None:
    """The group attributes of an Eyrie store at path, or None if path holds no Zarr group."""
    meta = path / "zarr.json"
    if not meta.is_file():
        return None
    try:
        doc = read_json(meta)
    except (OSError, ValueError) as exc:
        raise StoreError(
            f"{path}: zarr.json is unreadable ({exc}); delete {path} and rerun"
        ) from None
    return doc.get("attributes", {}) if doc.get("node_type") == "group" else None


def check_version(path: Path, attrs: dict) -> None:
    version = attrs.get("eyrie_store_version")
    if version is None:
        raise StoreError(
            f"{path} is a Zarr group but not an Eyrie shard store (no eyrie_store_version "
            "attribute); point to a store written by eyrie extract, or choose another path"
        )
    if version != STORE_VERSION:
        raise StoreError(
            f"{path} has eyrie_store_version {version!r}; this Eyrie reads version "
            f"{STORE_VERSION}. Re-extract the shard, or use the Eyrie release that wrote it"
        )


def read_commit(path: Path) -> dict:
    p = path / COMMIT_RECORD
    try:
        rec = read_json(p)
        n, t = int(rec["num_samples"]), int(rec["num_tokens"])
        str(rec["sample_ids_sha256"])
    except FileNotFoundError:
        raise StoreError(
            f"{path}: no {COMMIT_RECORD}; the store was not written by Eyrie or was damaged. "
            f"Delete {path} and re-extract the shard"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StoreError(
            f"{path}: {COMMIT_RECORD} is unreadable ({exc!r}); delete {path} and re-extract"
        ) from None
    if n < 0 or t < 0:
        raise StoreError(f"{path}: {COMMIT_RECORD} has negative counts; delete {path}")
    return rec


def local_store(path: Path, read_only: bool) -> zarr.storage.LocalStore:
    return zarr.storage.LocalStore(str(path), read_only=read_only)


# zarr-python warns each time it makes a numcodecs codec (the bf16 arrays' ``numcodecs.shuffle``,
# eyrie/store/codecs.py): when a store is created and whenever an array's metadata is read.
NUMCODECS_WARNING = r"Numcodecs codecs are not in the Zarr version 3 specification"
_QUIET = threading.RLock()  # hidden_compressors nests in create_arrays


@contextmanager
def quiet_numcodecs() -> Iterator[None]:
    """That one warning ignored while Eyrie creates or opens a store's arrays; no other.

    ``warnings.catch_warnings`` swaps the process's filter list and puts it back on exit (the
    list is global, so zarr's event-loop thread, which reads the metadata, sees the filter
    too); the lock keeps two Eyrie threads from restoring each other's lists out of order,
    which could leave the filter in place for good. Other code still gets the warning.
    """
    with _QUIET, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=NUMCODECS_WARNING, category=UserWarning)
        yield


def expected_chunk_files(arr: zarr.Array, length: int, start: int = 0) -> list[str]:
    """Relative paths of the chunk (or shard) files holding entries [start, length)."""
    outer = arr.metadata.chunk_grid.chunk_shape[0]
    tail = "/0" * (arr.ndim - 1)
    return [f"c/{i}{tail}" for i in range(start // outer, -(-length // outer))]


def fsync(path: Path) -> None:
    """Flush a file or folder to stable storage (a folder: the names it holds)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on folders; nothing more can be done
        pass
    finally:
        os.close(fd)


def _each(fn, items) -> None:
    for x in items:
        fn(x)


def folders_present(root: Path, rel_files: list[str]) -> set[Path]:
    """The folders on the way from root to each file that exist now (see fsync_tree)."""
    present, seen = set(), set()
    for rel in rel_files:
        folder = (root / rel).parent
        while folder not in seen and folder != root and root in folder.parents:
            seen.add(folder)
            if folder.is_dir():
                present.add(folder)
            folder = folder.parent
    return present


def fsync_tree(root: Path, rel_files: list[str], each=None, synced=frozenset(), existed=None):
    """fsync each file, then the folders holding their names (renames are durable).

    ``each(fn, items)`` runs the files' fsyncs (e.g. on several threads, returning when all are
    done); by default one after another. Folders come after all files, deepest first. Files
    in ``synced`` were fsynced by the caller since they were last written: only their folders
    are (a second fsync of a file costs a system call and, on some file systems, a wait).

    Without ``existed`` every folder from each file's up to root is fsynced. With it (the
    folders present before the files were written, ``folders_present``) only those whose
    entries changed are: each file's own folder, and the parent of every folder made since.
    The folders above hold no new name, and a commit fsynced up to 27 of them for nothing.
    """
    (each or _each)(fsync, [root / rel for rel in rel_files if rel not in synced])
    folders = set() if existed is not None else {root}
    for rel in rel_files:
        folder = (root / rel).parent
        folders.add(folder)
        while folder != root and root in folder.parents:
            if existed is not None and folder in existed:
                break
            folder = folder.parent
            folders.add(folder)
    for folder in sorted(folders, key=lambda f: -len(f.parts)):
        fsync(folder)
