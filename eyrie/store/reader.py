"""Reading shard stores: one store by sample (ShardReader), many as one torch Dataset.

A reader trusts nothing past the commit record: it checks every array's length, dtype and chunk
files against ``commit.json`` before the first read, so a damaged or half-copied store is named
at open time, not mid-training.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path

import numpy as np
import torch
import zarr

from eyrie.common.provenance import dir_bytes
from eyrie.store.format import (
    COMMIT_RECORD,
    StoreError,
    check_version,
    expected_chunk_files,
    from_bf16_bits,
    ids_digest,
    local_store,
    quiet_numcodecs,
    read_commit,
    root_attrs,
)


class ShardReader:
    """Random access by sample to one store, up to its commit record."""

    def __init__(self, path, *, require_complete: bool = True):
        self.path = p = Path(path)
        if not p.is_dir():
            raise StoreError(f"shard store {p} does not exist; run the extract stage to write it")
        attrs = root_attrs(p)
        if attrs is None:
            raise StoreError(f"{p} is not a Zarr v3 group (no group zarr.json); wrong path?")
        check_version(p, attrs)
        complete = bool(attrs.get("complete", False))
        if require_complete and not complete:
            raise StoreError(
                f"{p} is incomplete (its writer has not finished); rerun the extract stage to "
                "resume it, or pass require_complete=False to read the committed part"
            )
        rec = read_commit(p)
        n, t = int(rec["num_samples"]), int(rec["num_tokens"])
        group = zarr.open_group(local_store(p, True), mode="r")
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
                with quiet_numcodecs():  # the bf16 arrays' numcodecs.shuffle (codecs.py)
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
                f for f in expected_chunk_files(arr, shape[0]) if not (p / name / f).is_file()
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
        if ids_digest(self.sample_ids) != rec["sample_ids_sha256"]:
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
        return dir_bytes(self.path)


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
