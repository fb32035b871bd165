"""A shard store read raw from its Zarr arrays, and the checks of its format and values.

The arrays are read straight, not through the store's reader, so each kind of damage (a chunk
that does not decode, offsets out of order, NaN or all-zero rows) is named by itself instead of
as one refusal to open.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eyrie.validate.problems import Problems

EXP_MASK, MAG_MASK = np.uint16(0x7F80), np.uint16(0x7FFF)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Exact float32 values of bf16 bit patterns (numpy only)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


@dataclass
class RawStore:
    path: Path
    attrs: dict
    n: int
    t: int
    arrays: dict
    sample_ids: list | None = None
    offsets: np.ndarray | None = None


def open_raw(path: Path, problems: Problems) -> RawStore | None:
    import zarr

    from eyrie.store.format import quiet_numcodecs
    from eyrie.validate.advice import half_deleted

    if not path.is_dir():
        problems.add("unreadable", None, f"{path} does not exist; extract this shard")
        return None
    if why := half_deleted(path):
        problems.add("unreadable", None, f"{why}; delete it and extract this shard again")
        return None
    try:
        group = zarr.open_group(zarr.storage.LocalStore(str(path), read_only=True), mode="r")
        attrs = dict(group.attrs)
        commit = json.loads((path / "commit.json").read_text())
        n, t = int(commit["num_samples"]), int(commit["num_tokens"])
        with quiet_numcodecs():  # the bf16 arrays' numcodecs.shuffle (eyrie/store/codecs.py)
            arrays = {
                k: group[k]
                for k in (
                    "input_ids",
                    "loss_mask",
                    "aux_hidden",
                    "final_hidden",
                    "offsets",
                    "sample_id",
                )
            }
    except Exception as exc:  # any failure here means the store cannot be used at all
        problems.add("unreadable", None, f"{path}: {type(exc).__name__}: {exc}")
        return None
    return RawStore(path, attrs, n, t, arrays)


def check_structure(raw: RawStore, expected_aux: list[int], hidden: int, p: Problems) -> bool:
    """Attributes, offsets and ids; True when samples can be sliced by offsets."""
    a = raw.attrs
    if not a.get("complete", False):
        p.add("incomplete", None, f"{raw.path} is not complete; rerun its extract job")
    if a.get("aux_layer_ids") != expected_aux:
        p.add("aux_layer_ids", None, f"stored {a.get('aux_layer_ids')}, configured {expected_aux}")
    for key, want in (
        ("layer_convention", "output"),
        ("dtype", "bfloat16"),
        ("hidden_size", hidden),
    ):
        if a.get(key) != want:
            p.add("attrs", None, f"{key} is {a.get(key)!r}, expected {want!r}")
    k = len(a.get("aux_layer_ids") or [])
    shapes = {
        "input_ids": (raw.t,),
        "loss_mask": (raw.t,),
        "aux_hidden": (raw.t, k, hidden),
        "final_hidden": (raw.t, hidden),
        "offsets": (raw.n + 1,),
        "sample_id": (raw.n,),
    }
    sliceable = True
    for name, shape in shapes.items():
        have = raw.arrays[name].shape
        longer = a.get("complete", False) and have[0] > shape[0]  # a finished store is exact
        if have[1:] != shape[1:] or have[0] < shape[0] or longer:
            p.add("offsets", None, f"array {name} has shape {have}, the commit needs {shape}")
            sliceable = False
    if not sliceable:
        return False
    try:
        raw.offsets = np.asarray(raw.arrays["offsets"][: raw.n + 1], dtype=np.int64)
        raw.sample_ids = [str(s) for s in raw.arrays["sample_id"][: raw.n]] if raw.n else []
    except Exception as exc:
        p.add("checksum", None, f"offsets or sample_id do not decode: {exc}")
        return False
    off = raw.offsets
    bad = []
    if off[0] != 0:
        bad.append(f"offsets[0] is {off[0]}")
    if off[-1] != raw.t:
        bad.append(f"offsets[-1] is {off[-1]}, the store holds {raw.t} tokens")
    steps = np.flatnonzero(np.diff(off) <= 0)
    if len(steps):
        bad.append(f"offsets do not increase at samples {steps[:5].tolist()}")
    for msg in bad:
        p.add("offsets", None, msg)
    for sid, n in Counter(raw.sample_ids).items():
        for _ in range(n - 1):
            p.add("duplicate", sid, f"stored {n} times")
    return not bad


def read_rows(raw: RawStore, lo: int, hi: int) -> dict:
    a = raw.arrays
    return {
        name: a[name][lo:hi] for name in ("input_ids", "loss_mask", "aux_hidden", "final_hidden")
    }


def iter_samples(raw: RawStore, p: Problems, block_tokens: int = 4096):
    """(index, sample_id, arrays) for each sample that decodes; decode failures are problems."""
    off, ids = raw.offsets, raw.sample_ids
    i = 0
    while i < raw.n:
        j = i + 1
        while j < raw.n and off[j + 1] - off[i] <= block_tokens:
            j += 1
        try:
            block = read_rows(raw, int(off[i]), int(off[j]))
            parts = [
                (s, {k: v[off[s] - off[i] : off[s + 1] - off[i]] for k, v in block.items()})
                for s in range(i, j)
            ]
        except Exception:  # find which samples of the block are damaged
            parts = []
            for s in range(i, j):
                arrays, bad = {}, []
                for name in ("input_ids", "loss_mask", "aux_hidden", "final_hidden"):
                    try:
                        arrays[name] = raw.arrays[name][int(off[s]) : int(off[s + 1])]
                    except Exception as exc:
                        text = str(exc) or type(exc).__name__
                        bad.append(f"{name}: {text[:1].lower()}{text[1:]}")
                if bad:
                    p.add("checksum", ids[s], "; ".join(bad))
                else:
                    parts.append((s, arrays))
        for s, arrays in parts:
            yield s, ids[s], arrays
        i = j


def check_values(sid: str, arr: dict, ref: list[int] | None, p: Problems) -> None:
    ids = np.asarray(arr["input_ids"])
    if ref is not None:
        if len(ids) != len(ref):
            p.add("length", sid, f"stored {len(ids)} tokens, re-tokenized {len(ref)}")
        elif not np.array_equal(ids, np.asarray(ref, dtype=ids.dtype)):
            first = int(np.flatnonzero(ids != np.asarray(ref, dtype=ids.dtype))[0])
            p.add("input_ids", sid, f"first differing token at position {first}")
    mask = np.asarray(arr["loss_mask"])
    if not np.isin(mask, (0, 1)).all() or not mask.any():
        p.add("loss_mask", sid, "values other than 0/1, or no token marked")
    for name in ("aux_hidden", "final_hidden"):
        bits = np.asarray(arr[name])
        if ((bits & EXP_MASK) == EXP_MASK).any():
            p.add("non_finite", sid, f"{name} holds NaN or Inf")
        zero = ((bits & MAG_MASK) == 0).all(axis=-1)
        if zero.any():
            where = np.argwhere(zero)[0].tolist()
            p.add("zero_rows", sid, f"{name} has {int(zero.sum())} all-zero rows, first at {where}")
