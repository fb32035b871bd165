"""The hidden-state shard store: one Zarr v3 store per shard, crash-safe and lossless.

Layout, codecs and the commit protocol are specified in docs/store-format.md; the format is
the contract, this module is one implementation of it.

Why it looks the way it does:
- Samples are ragged, so every per-token array shares one flat token axis and ``offsets``
  (n + 1 int64) marks where each sample starts and ends.
- Zarr has no bfloat16, so hidden states are stored as their raw 16-bit patterns (uint16);
  ``bf16_bits`` and ``from_bf16_bits`` convert without touching a single bit.
- A writer may be killed at any instant. Data for new samples is written and fsynced first;
  only then is ``commit.json`` atomically replaced. A rerun shrinks every array back to the
  committed length, so a half-written sample is never visible and nothing is ever duplicated.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr

from eyrie.common.errors import EyrieError
from eyrie.store.codecs import WRITE_CONFIG as _WRITE_CONFIG
from eyrie.store.codecs import (
    PrecisionError,
    mantissa_bits,
    precision_attrs,
    round_bf16_bits,
    stored_mantissa_bits,
)
from eyrie.store.codecs import create_arrays as _create_arrays
from eyrie.store.lock import StoreLock

STORE_VERSION = 1
COMMIT_RECORD = "commit.json"
TOKEN_ARRAYS = ("input_ids", "loss_mask", "aux_hidden", "final_hidden")
SAMPLE_ARRAYS = ("offsets", "sample_id")
ALL_ARRAYS = TOKEN_ARRAYS + SAMPLE_ARRAYS
_OUR_TMP = ".eyrie-tmp"
_ZARR_TMP = re.compile(r"\.[0-9a-f]{32}\.partial$")  # zarr's LocalStore temp names


class StoreError(EyrieError, RuntimeError):
    """A store that cannot be written or read as asked; the message names the store and the fix."""


# ---------------------------------------------------------------------------------------------
# bfloat16 <-> uint16 bit patterns


def bf16_bits(t: torch.Tensor) -> np.ndarray:
    """The raw 16-bit patterns of a bfloat16 tensor as uint16 (floats are cast to bf16 first).

    The result shares memory with ``t`` when ``t`` is already a contiguous CPU bf16 tensor.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"bf16_bits takes a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.bfloat16:
        if not t.is_floating_point():
            raise TypeError(f"bf16_bits takes a floating-point tensor, got {t.dtype}")
        t = t.to(torch.bfloat16)
    return t.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)


def from_bf16_bits(a: np.ndarray) -> torch.Tensor:
    """A bfloat16 tensor from uint16 bit patterns, bit for bit (the inverse of bf16_bits)."""
    a = np.asarray(a)
    if a.dtype != np.uint16:
        raise TypeError(f"from_bf16_bits takes a uint16 array, got {a.dtype}")
    if not (a.flags.c_contiguous and a.flags.writeable):
        a = np.ascontiguousarray(a).copy()
    return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# small helpers


def _json_normal(obj: Any, what: str, path: Path) -> Any:
    """obj as it reads back from JSON (tuples become lists); StoreError if it is not JSON."""
    try:
        return json.loads(json.dumps(obj, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise StoreError(
            f"{path}: {what} must be plain JSON (dicts, lists, str, int, float, bool, None): "
            f"{exc}. Convert the offending values to strings before passing them."
        ) from None


def _ids_digest(ids: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()


def _read_json(p: Path) -> dict:
    with open(p, encoding="utf-8") as f:
        return json.load(f)


def _write_json_atomic(p: Path, obj: dict) -> None:
    """Write to a temp name in the same folder, then os.replace: readers see old or new."""
    tmp = p.with_name(f"{p.name}.{uuid.uuid4().hex}{_OUR_TMP}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        _fsync(p.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _root_attrs(path: Path) -> dict | None:
    """The group attributes of an Eyrie store at path, or None if path holds no Zarr group."""
    meta = path / "zarr.json"
    if not meta.is_file():
        return None
    try:
        doc = _read_json(meta)
    except (OSError, ValueError) as exc:
        raise StoreError(
            f"{path}: zarr.json is unreadable ({exc}); delete {path} and rerun"
        ) from None
    return doc.get("attributes", {}) if doc.get("node_type") == "group" else None


def _check_version(path: Path, attrs: dict) -> None:
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


def _read_commit(path: Path) -> dict:
    p = path / COMMIT_RECORD
    try:
        rec = _read_json(p)
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


def _store(path: Path, read_only: bool) -> zarr.storage.LocalStore:
    return zarr.storage.LocalStore(str(path), read_only=read_only)


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def _expected_chunk_files(arr: zarr.Array, length: int, start: int = 0) -> list[str]:
    """Relative paths of the chunk (or shard) files holding entries [start, length)."""
    outer = arr.metadata.chunk_grid.chunk_shape[0]
    tail = "/0" * (arr.ndim - 1)
    return [f"c/{i}{tail}" for i in range(start // outer, -(-length // outer))]


def _fsync(path: Path) -> None:
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


def _fsync_tree(root: Path, rel_files: list[str]) -> None:
    """fsync each file, then every folder from its parent up to root (renames are durable)."""
    folders = {root}
    for rel in rel_files:
        _fsync(root / rel)
        parent = (root / rel).parent
        while parent != root and root in parent.parents:
            folders.add(parent)
            parent = parent.parent
    for folder in sorted(folders, key=lambda f: -len(f.parts)):
        _fsync(folder)


# ---------------------------------------------------------------------------------------------
# writer


class ShardWriter:
    """Appends samples to one shard store; commit() makes them durable, finish() seals it.

    Opening an existing store resumes from its last commit: anything written after it is
    discarded. One writer per store at a time: the writer holds `eyrie.store.lock.StoreLock`
    (a file lock beside the store, taken before the store is looked at), or is given one its
    caller holds. ``num_samples``/``num_tokens`` count committed samples only.
    """

    def __init__(
        self,
        path,
        *,
        hidden_size: int,
        aux_layer_ids: list[int],
        provenance: dict,
        chunk_tokens: int = 256,
        shard_tokens: int = 16384,
        lock: StoreLock | None = None,
        precision: str = "lossless",
    ):
        self.path = Path(path)
        self._closed = False
        try:  # lossless, or bitround-N: N mantissa bits kept (eyrie/store/codecs.py)
            self.mantissa_bits = mantissa_bits(precision)
        except PrecisionError as exc:
            raise StoreError(f"{self.path}: {exc}") from None
        self.precision = precision_attrs(precision)
        self._check_params(hidden_size, aux_layer_ids, provenance, chunk_tokens, shard_tokens)
        self.hidden_size = int(hidden_size)
        self.aux_layer_ids = [int(i) for i in aux_layer_ids]
        self.provenance = _json_normal(provenance, "provenance", self.path)
        if lock is not None and not (lock.held and lock.store == self.path):
            raise StoreError(f"{self.path}: the lock given is not held for this store")
        self._own_lock = lock is None
        self._store_lock = lock if lock is not None else StoreLock(self.path).acquire()
        self._buffer: list[tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._buffered_ids: set[str] = set()
        self._buffered_tokens = 0

        try:
            attrs = _root_attrs(self.path) if self.path.is_dir() else None
            if attrs is None:
                if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
                    raise StoreError(
                        f"{self.path} exists and is not an Eyrie shard store; remove it or "
                        "choose another output path"
                    )
                self._create(chunk_tokens, shard_tokens)
            self._remove_stale_creations()
            self._open_and_resume()
        except BaseException:
            self.close()
            raise

    # -- setup --------------------------------------------------------------------------------

    def _check_params(self, hidden_size, aux_layer_ids, provenance, chunk_tokens, shard_tokens):
        p = self.path

        def pos_int(x):
            return isinstance(x, int | np.integer) and not isinstance(x, bool) and x > 0

        if not pos_int(hidden_size):
            raise StoreError(f"{p}: hidden_size must be a positive int, got {hidden_size!r}")
        ids = list(aux_layer_ids) if isinstance(aux_layer_ids, list | tuple) else None
        if not ids or not all(isinstance(i, int | np.integer) and i >= 0 for i in ids):
            raise StoreError(
                f"{p}: aux_layer_ids must be a non-empty list of layer indices >= 0, "
                f"got {aux_layer_ids!r}"
            )
        if len(set(ids)) != len(ids):
            raise StoreError(f"{p}: aux_layer_ids {ids} repeats a layer; list each layer once")
        if not isinstance(provenance, dict):
            raise StoreError(f"{p}: provenance must be a dict, got {type(provenance).__name__}")
        if not (pos_int(chunk_tokens) and pos_int(shard_tokens)):
            raise StoreError(
                f"{p}: chunk_tokens and shard_tokens must be positive ints, got "
                f"{chunk_tokens!r} and {shard_tokens!r}"
            )
        if shard_tokens % chunk_tokens:
            raise StoreError(
                f"{p}: shard_tokens ({shard_tokens}) must be a multiple of chunk_tokens "
                f"({chunk_tokens}); e.g. extract.shard_tokens: {chunk_tokens * 64}"
            )

    def _remove_stale_creations(self) -> None:
        """Temp folders left by a writer killed while creating this store."""
        parent = self.path.parent
        if not parent.is_dir():
            return
        prefix = f".{self.path.name}.{_OUR_TMP.lstrip('.')}-"
        for p in parent.iterdir():
            if p.name.startswith(prefix) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)

    def _create(self, chunk_tokens: int, shard_tokens: int) -> None:
        """Build the empty store under a temp name, then rename it into place (all or nothing)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.parent / f".{self.path.name}.{_OUR_TMP.lstrip('.')}-{uuid.uuid4().hex}"
        try:
            group = zarr.open_group(_store(tmp, False), mode="w-", zarr_format=3)
            group.attrs.update(
                {
                    "eyrie_store_version": STORE_VERSION,
                    "aux_layer_ids": self.aux_layer_ids,
                    "layer_convention": "output",
                    "dtype": "bfloat16",
                    "hidden_size": self.hidden_size,
                    "chunk_tokens": int(chunk_tokens),
                    "shard_tokens": int(shard_tokens),
                    "complete": False,
                    "precision": self.precision,
                    "provenance": self.provenance,
                }
            )
            _create_arrays(
                group, len(self.aux_layer_ids), self.hidden_size, chunk_tokens, shard_tokens
            )
            _write_json_atomic(
                tmp / COMMIT_RECORD,
                {
                    "eyrie_store_version": STORE_VERSION,
                    "num_samples": 0,
                    "num_tokens": 0,
                    "sample_ids_sha256": _ids_digest([]),
                },
            )
            _fsync_tree(tmp, [str(f.relative_to(tmp)) for f in tmp.rglob("*") if f.is_file()])
            try:
                os.replace(tmp, self.path)  # also replaces an empty folder at self.path
                _fsync(self.path.parent)
            except OSError:
                if _root_attrs(self.path) is None:  # not another writer's fresh store
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _open_and_resume(self) -> None:
        p = self.path
        attrs = _root_attrs(p) or {}
        _check_version(p, attrs)
        if attrs.get("hidden_size") != self.hidden_size:
            raise StoreError(
                f"{p} holds hidden_size {attrs.get('hidden_size')}, this writer has "
                f"{self.hidden_size}; delete {p} to re-extract for the new target, or use the "
                "target the store was started with"
            )
        if attrs.get("aux_layer_ids") != self.aux_layer_ids:
            raise StoreError(
                f"{p} holds aux_layer_ids {attrs.get('aux_layer_ids')}, this writer has "
                f"{self.aux_layer_ids}; delete {p} to re-extract with the new layers"
            )
        if stored_mantissa_bits(attrs) != self.mantissa_bits:
            raise StoreError(
                f"{p} holds precision {attrs.get('precision', 'lossless')}, this writer "
                f"{self.precision}; delete {p} to re-extract at the new precision"
            )
        old = attrs.get("provenance")
        if old != self.provenance:
            keys = sorted(
                k
                for k in set(old or {}) | set(self.provenance)
                if (old or {}).get(k) != self.provenance.get(k)
            )
            raise StoreError(
                f"{p} was started with different provenance (differing keys: {keys}); resuming "
                f"would mix hidden states from two setups. Delete {p} to re-extract"
            )
        self.chunk_tokens = int(attrs.get("chunk_tokens", 0))
        self.shard_tokens = int(attrs.get("shard_tokens", 0))
        self.complete = bool(attrs.get("complete", False))

        for root, _dirs, files in os.walk(p):  # temp files of a killed writer
            for name in files:
                if name.endswith(_OUR_TMP) or _ZARR_TMP.search(name):
                    os.unlink(os.path.join(root, name))

        rec = _read_commit(p)
        n, t = int(rec["num_samples"]), int(rec["num_tokens"])
        self._group = zarr.open_group(_store(p, False), mode="r+")
        self._arrays = {}
        for name in ALL_ARRAYS:
            try:
                arr = self._group[name]
            except KeyError:
                raise StoreError(
                    f"{p}: array {name!r} is missing; delete {p} and re-extract"
                ) from None
            self._arrays[name] = arr.with_config(_WRITE_CONFIG)
        want = {"offsets": n + 1, "sample_id": n, **dict.fromkeys(TOKEN_ARRAYS, t)}
        for name, arr in self._arrays.items():
            have = arr.shape[0]
            if have < want[name]:
                raise StoreError(
                    f"{p}: array {name} has {have} entries but {COMMIT_RECORD} commits "
                    f"{want[name]}; the store is damaged, delete {p} and re-extract"
                )
            if have > want[name]:
                if self.complete:
                    raise StoreError(
                        f"{p} is marked complete but {name} is longer than committed; the "
                        f"store is damaged, delete {p} and re-extract"
                    )
                arr.resize((want[name], *arr.shape[1:]))  # drop what was written past commit
        ids = [str(s) for s in self._arrays["sample_id"][:]] if n else []
        offsets = self._arrays["offsets"][:]
        if _ids_digest(ids) != rec["sample_ids_sha256"] or int(offsets[-1]) != t:
            raise StoreError(
                f"{p}: sample ids or offsets disagree with {COMMIT_RECORD}; the store is "
                f"damaged, delete {p} and re-extract"
            )
        self.committed_ids: list[str] = ids
        self._committed_set = set(ids)
        self.num_samples = n
        self.num_tokens = t

    # -- public -------------------------------------------------------------------------------

    @property
    def buffered_samples(self) -> int:
        return len(self._buffer)

    @property
    def buffered_tokens(self) -> int:
        return self._buffered_tokens

    def append(self, sample_id: str, input_ids, loss_mask, aux_hidden, final_hidden) -> None:
        """Validate one sample and buffer it in memory (nothing is written until commit)."""
        p = self.path
        self._check_open()
        if self.complete:
            raise StoreError(
                f"{p} is complete (finished); appending {sample_id!r} would reopen it. "
                f"Delete {p} to re-extract, or write new samples to another shard"
            )
        if not isinstance(sample_id, str) or not sample_id:
            raise StoreError(f"{p}: sample_id must be a non-empty str, got {sample_id!r}")
        if sample_id in self._committed_set or sample_id in self._buffered_ids:
            raise StoreError(
                f"{p}: sample {sample_id!r} is already in this shard; skip ids in "
                "writer.committed_ids when resuming, and make dataset ids unique"
            )
        who = f"{p}: sample {sample_id!r}"
        ids = self._int_vector(input_ids, "input_ids", who)
        n_tok = ids.shape[0]
        if n_tok == 0:
            raise StoreError(f"{who} has no tokens; drop empty samples before extraction")
        if ids.min() < 0 or ids.max() > np.iinfo(np.int32).max:
            raise StoreError(f"{who}: input_ids must be token ids in [0, 2**31), got out-of-range")
        mask = self._int_vector(loss_mask, "loss_mask", who, allow_bool=True)
        if mask.shape[0] != n_tok:
            raise StoreError(f"{who}: loss_mask has {mask.shape[0]} tokens, input_ids {n_tok}")
        if mask.size and not np.isin(mask, (0, 1)).all():
            raise StoreError(f"{who}: loss_mask must hold only 0/1 (or bool)")
        k, h = len(self.aux_layer_ids), self.hidden_size
        aux = self._bits(aux_hidden, "aux_hidden", (n_tok, k, h), who)
        fin = self._bits(final_hidden, "final_hidden", (n_tok, h), who)
        if self.mantissa_bits is not None:  # the lossy precision: rounded before compression
            aux, fin = (round_bf16_bits(x, self.mantissa_bits) for x in (aux, fin))
        self._buffer.append((sample_id, ids.astype(np.int32), mask.astype(np.uint8), aux, fin))
        self._buffered_ids.add(sample_id)
        self._buffered_tokens += n_tok

    def commit(self) -> None:
        """Write buffered samples, then atomically replace the commit record (the commit point)."""
        if not self._buffer:
            return
        n0, t0 = self.num_samples, self.num_tokens
        batch = self._buffer
        new_ids = [b[0] for b in batch]
        lengths = np.array([b[1].shape[0] for b in batch], dtype=np.int64)
        n1, t1 = n0 + len(batch), t0 + int(lengths.sum())
        a = self._arrays
        for j, name in enumerate(TOKEN_ARRAYS, start=1):
            block = np.concatenate([b[j] for b in batch])  # one array at a time bounds memory
            a[name].resize((t1, *a[name].shape[1:]))
            a[name][t0:t1] = block
            del block
        a["offsets"].resize((n1 + 1,))
        a["offsets"][n0 + 1 : n1 + 1] = t0 + np.cumsum(lengths)
        a["sample_id"].resize((n1,))
        a["sample_id"][n0:n1] = np.array(new_ids, dtype=object)
        # Make the data durable before the commit record that points at it (power loss too).
        spans = {"offsets": (n0, n1 + 1), "sample_id": (n0, n1)}
        touched = ["zarr.json"]
        for name, arr in a.items():
            lo, hi = spans.get(name, (t0, t1))
            touched += [f"{name}/{f}" for f in ["zarr.json", *_expected_chunk_files(arr, hi, lo)]]
        _fsync_tree(self.path, touched)
        ids = self.committed_ids + new_ids
        self._write_commit_record(n1, t1, ids)
        self.committed_ids = ids
        self._committed_set.update(new_ids)
        self.num_samples, self.num_tokens = n1, t1
        self._buffer, self._buffered_ids, self._buffered_tokens = [], set(), 0

    def finish(self) -> None:
        """Commit, then mark the store complete (readers accept only complete stores)."""
        self._check_open()
        self.commit()
        if self.complete:
            return
        self._group.attrs.update({"complete": True})  # zarr.json rewritten via temp + rename
        _fsync_tree(self.path, ["zarr.json"])
        self.complete = True

    def close(self) -> None:
        """Release the store without committing what is buffered."""
        self._buffer = []
        self._buffered_ids = set()
        self._buffered_tokens = 0
        self._closed = True
        if self._own_lock:
            self._store_lock.release()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.commit()
        finally:
            self.close()

    # -- internals ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self.path}: this writer is closed; open a new ShardWriter")

    def _write_commit_record(self, n: int, t: int, ids: list[str]) -> None:
        _write_json_atomic(
            self.path / COMMIT_RECORD,
            {
                "eyrie_store_version": STORE_VERSION,
                "num_samples": n,
                "num_tokens": t,
                "sample_ids_sha256": _ids_digest(ids),
            },
        )

    @staticmethod
    def _int_vector(x, name: str, who: str, allow_bool: bool = False) -> np.ndarray:
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu().numpy()
        a = np.asarray(x)
        ok = np.issubdtype(a.dtype, np.integer) or (allow_bool and a.dtype == np.bool_)
        if not ok:
            raise StoreError(f"{who}: {name} must be an integer array, got dtype {a.dtype}")
        if a.ndim != 1:
            raise StoreError(f"{who}: {name} must be 1-D (tokens,), got shape {a.shape}")
        return a

    @staticmethod
    def _bits(x, name: str, shape: tuple, who: str) -> np.ndarray:
        """An owned uint16 copy of bf16 bit patterns; floats are rounded to bf16."""
        if isinstance(x, np.ndarray) and x.dtype == np.uint16:
            bits = x
        elif isinstance(x, torch.Tensor) and x.is_floating_point():
            bits = bf16_bits(x)
        elif isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating):
            bits = bf16_bits(torch.from_numpy(np.ascontiguousarray(x)))
        else:
            dtype = getattr(x, "dtype", type(x).__name__)
            raise StoreError(
                f"{who}: {name} must be a floating tensor (bf16 preferred) or a uint16 array "
                f"of bf16 bits, got {dtype}"
            )
        if tuple(bits.shape) != shape:
            raise StoreError(f"{who}: {name} must have shape {shape}, got {tuple(bits.shape)}")
        return np.array(bits, dtype=np.uint16, copy=True, order="C")


# ---------------------------------------------------------------------------------------------
# reader


class ShardReader:
    """Random access by sample to one store, up to its commit record."""

    def __init__(self, path, *, require_complete: bool = True):
        self.path = p = Path(path)
        if not p.is_dir():
            raise StoreError(f"shard store {p} does not exist; run the extract stage to write it")
        attrs = _root_attrs(p)
        if attrs is None:
            raise StoreError(f"{p} is not a Zarr v3 group (no group zarr.json); wrong path?")
        _check_version(p, attrs)
        complete = bool(attrs.get("complete", False))
        if require_complete and not complete:
            raise StoreError(
                f"{p} is incomplete (its writer has not finished); rerun the extract stage to "
                "resume it, or pass require_complete=False to read the committed part"
            )
        rec = _read_commit(p)
        n, t = int(rec["num_samples"]), int(rec["num_tokens"])
        group = zarr.open_group(_store(p, True), mode="r")
        self.attrs = dict(group.attrs)
        self.aux_layer_ids = list(attrs["aux_layer_ids"])
        self.hidden_size = int(attrs["hidden_size"])
        self.num_tokens = t
        k, h = len(self.aux_layer_ids), self.hidden_size
        want = {
            "input_ids": ((t,), np.int32),
            "loss_mask": ((t,), np.uint8),
            "aux_hidden": ((t, k, h), np.uint16),
            "final_hidden": ((t, h), np.uint16),
            "offsets": ((n + 1,), np.int64),
            "sample_id": ((n,), None),
        }
        self._arrays = {}
        for name, (shape, dtype) in want.items():
            try:
                arr = group[name]
            except KeyError:
                raise StoreError(f"{p}: array {name!r} is missing; re-extract the shard") from None
            have = arr.shape
            bad_len = have[0] < shape[0] or (complete and have[0] != shape[0])
            if bad_len or have[1:] != shape[1:] or (dtype and arr.dtype != dtype):
                raise StoreError(
                    f"{p}: array {name} is {arr.dtype}{have}, expected {shape} (dtype "
                    f"{np.dtype(dtype) if dtype else 'string'}); the store is damaged or not "
                    "written by this Eyrie version; re-extract the shard"
                )
            missing = [
                f for f in _expected_chunk_files(arr, shape[0]) if not (p / name / f).is_file()
            ]
            if missing:
                raise StoreError(
                    f"{p}: array {name} is missing chunk files {missing[:3]} (copied "
                    "partially?); copy the shard again or re-extract it"
                )
            self._arrays[name] = arr
        self.offsets = self._read("offsets", slice(0, n + 1))
        self.sample_ids = [str(s) for s in self._read("sample_id", slice(0, n))] if n else []
        diffs = np.diff(self.offsets)
        if self.offsets[0] != 0 or self.offsets[-1] != t or (diffs <= 0).any():
            raise StoreError(f"{p}: offsets are inconsistent with {COMMIT_RECORD}; re-extract")
        if _ids_digest(self.sample_ids) != rec["sample_ids_sha256"]:
            raise StoreError(f"{p}: sample ids disagree with {COMMIT_RECORD}; re-extract")
        self._index = {s: i for i, s in enumerate(self.sample_ids)}
        if len(self._index) != n:
            raise StoreError(f"{p}: sample ids repeat; the store is damaged, re-extract it")

    def _read(self, name: str, sel) -> np.ndarray:
        try:
            return self._arrays[name][sel]
        except (ValueError, RuntimeError) as exc:  # crc32c mismatch, other decode failures
            raise StoreError(
                f"{self.path}: array {name} failed to decode at {sel} ({exc}); the file is "
                "corrupted on disk. Re-extract the shard (or restore it from a good copy)"
            ) from None

    def __len__(self) -> int:
        return len(self.sample_ids)

    def __getitem__(self, i: int) -> dict:
        n = len(self.sample_ids)
        if not -n <= i < n:
            raise IndexError(f"sample index {i} out of range for {self.path} ({n} samples)")
        i %= n
        sl = slice(int(self.offsets[i]), int(self.offsets[i + 1]))
        return {
            "sample_id": self.sample_ids[i],
            "input_ids": torch.from_numpy(self._read("input_ids", sl).astype(np.int64)),
            "loss_mask": torch.from_numpy(self._read("loss_mask", sl).astype(np.bool_)),
            "aux_hidden": from_bf16_bits(self._read("aux_hidden", sl)),
            "final_hidden": from_bf16_bits(self._read("final_hidden", sl)),
        }

    def sample_index(self, sample_id) -> int:
        try:
            return self._index[sample_id]
        except KeyError:
            raise KeyError(f"sample {sample_id!r} is not in {self.path}") from None

    def nbytes_stored(self) -> int:
        return _dir_bytes(self.path)


# ---------------------------------------------------------------------------------------------
# dataset


class ShardDataset(torch.utils.data.Dataset):
    """Samples of many shard stores as one map-style dataset.

    Picklable for DataLoader workers: readers are opened lazily in each process, never shared.
    """

    def __init__(self, paths: list, *, require_complete=True):
        if isinstance(paths, str | os.PathLike):
            paths = [paths]
        self.paths = [Path(p) for p in paths]
        if not self.paths:
            raise StoreError("ShardDataset needs at least one shard store path")
        self.require_complete = require_complete
        self._readers: dict[int, ShardReader] = {}
        self._pid = os.getpid()
        sizes = [len(self._reader(j)) for j in range(len(self.paths))]  # validates every store
        self._starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tolist()

    def _reader(self, j: int) -> ShardReader:
        if self._pid != os.getpid():  # a forked worker: never reuse the parent's handles
            self._readers, self._pid = {}, os.getpid()
        r = self._readers.get(j)
        if r is None:
            r = self._readers[j] = ShardReader(
                self.paths[j], require_complete=self.require_complete
            )
        return r

    def __len__(self) -> int:
        return self._starts[-1]

    def locate(self, i: int) -> tuple[int, int]:
        """(store index, sample index within that store) of global sample i."""
        if not 0 <= i < len(self):
            raise IndexError(f"sample index {i} out of range ({len(self)} samples)")
        j = bisect.bisect_right(self._starts, i) - 1
        return j, i - self._starts[j]

    def __getitem__(self, i: int) -> dict:
        j, local = self.locate(int(i))
        return self._reader(j)[local]

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_readers"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()


# ---------------------------------------------------------------------------------------------
# synthetic data for tests and benchmarks


def synthetic_activations(
    rng: np.random.Generator, tokens: int, k: int, hidden: int, *, model_seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden-state-like bf16 data: (aux (tokens, k, hidden), final (tokens, hidden)).

    Modelled on real residual streams, whose statistics decide how well they compress: per-channel
    scales (lognormal, growing with depth), heavy-tailed values (Student-t, 5 dof), a few outlier
    channels ~30x larger, and massive activations on the first token. Channel statistics come
    from ``model_seed`` (fixed per "model"); token values from ``rng``.
    """
    mr = np.random.default_rng(model_seed)
    scale = mr.lognormal(0.0, 0.5, size=(k + 1, hidden)).astype(np.float32)
    scale[:k] *= np.linspace(0.5, 2.0, k, dtype=np.float32)[:, None]
    outliers = mr.choice(hidden, size=max(2, hidden // 500), replace=False)
    scale[:, outliers] *= 30.0
    x = rng.standard_t(5, size=(tokens, k + 1, hidden)).astype(np.float32)
    x *= scale
    if tokens:
        x[0, :k, outliers[:2]] = 1000.0 * np.sign(x[0, :k, outliers[:2]])
    b = torch.from_numpy(x).to(torch.bfloat16)
    return b[:, :k].contiguous(), b[:, k].contiguous()
