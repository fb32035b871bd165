"""Shard files encoded by eyrie/store/shard_files.py hold exactly zarr's bytes.

Every file of a store written with ``shard_encoder="eyrie"`` must have the sha256 of the same
store written with ``shard_encoder="zarr"`` (arr[lo:hi] = values), over commits that end
inside a chunk, on a chunk edge, exactly on a shard edge, and that span several shards; and
the stores must read back, with plain zarr, as the values written. Both layouts of the bf16
arrays: "planes" (numcodecs.shuffle, then Blosc without shuffle: new stores) and "blosc"
(Blosc's byte shuffle: stores written before, which resumed writers keep appending to).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
from test_store import commit_killed_before_record
from test_store_codecs import inner_codecs, layout, plain_arrays

from eyrie.store.shard import ShardWriter

AUX = [0, 1, 2]
K = len(AUX)
PROV = {"target": "shard-files-test"}
ROWS = 1024  # distinct token rows of hidden states; samples are slices of them
LAYOUTS = ("planes", "blosc")  # the bf16 arrays' pipeline in new stores, and in older ones


def plan(shard: int, rng: np.random.Generator, over_shards: bool = True) -> list[list[int]]:
    """Sample lengths (1..600) per commit, the commits ending at chosen token counts.

    over_shards: with shards of up to 2048 tokens, then a commit over two whole shards.
    """
    ends = [700, shard, shard + 300, shard + 301, 2 * shard - 256, 2 * shard, 2 * shard + 5]
    if over_shards and shard <= 2048:
        ends += [4 * shard + 77, 4 * shard + 77 + 1]  # a commit over two whole shards
    commits, at = [], 0
    for end in ends:
        lengths = []
        while at < end:
            n = min(int(rng.integers(1, 601)), end - at)
            lengths.append(n)
            at += n
        commits.append(lengths)
    return commits


def rows(hidden: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """bf16-like uint16 patterns (finite, varied exponents) for aux and final states."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_t(5, size=(ROWS, K + 1, hidden)) * 2.0).astype(np.float32)
    b = (x.view(np.uint32) >> 16).astype(np.uint16)
    return np.ascontiguousarray(b[:, :K]), np.ascontiguousarray(b[:, K])


def check_encoders(w: ShardWriter, encoder: str, kind: str) -> None:
    """The files are written by the encoder asked for (no silent fallback to zarr), and the
    store is in the layout asked for."""
    names = [c["name"] for c in inner_codecs(w.path / "aux_hidden")]
    assert names == (
        ["bytes", "numcodecs.shuffle", "blosc", "crc32c"]
        if kind == "planes"
        else ["bytes", "blosc", "crc32c"]
    )
    if encoder == "zarr":
        assert w._shard_files is None
        return
    planes = 2 if kind == "planes" else None
    got = {name: e.planes for name, e in w._shard_files.encoders.items()}
    assert got == {
        "input_ids": None,
        "loss_mask": None,
        "aux_hidden": planes,
        "final_hidden": planes,
    }


def write(path, hidden, shard, precision, encoder, commits, aux_rows, fin_rows, kind):
    """Write the plan; returns the values written (uint16 patterns as given, before rounding)."""
    rng = np.random.default_rng(7)
    want = {"input_ids": [], "loss_mask": [], "aux_hidden": [], "final_hidden": []}
    with layout(kind):
        w = ShardWriter(
            path,
            hidden_size=hidden,
            aux_layer_ids=AUX,
            provenance=PROV,
            chunk_tokens=256,
            shard_tokens=shard,
            precision=precision,
            writer_threads=1,
            shard_encoder=encoder,
        )
    check_encoders(w, encoder, kind)
    with w:
        i = 0
        for lengths in commits:
            for n in lengths:
                start = int(rng.integers(0, ROWS - n + 1))
                ids = rng.integers(0, 128_000, n)
                mask = rng.integers(0, 2, n).astype(bool)
                aux, fin = aux_rows[start : start + n], fin_rows[start : start + n]
                w.append(f"s{i}", ids, mask, aux, fin)
                for key, v in zip(want, (ids, mask, aux, fin), strict=True):
                    want[key].append(v)
                i += 1
            w.commit()
        w.finish()
    return {key: np.concatenate(v) for key, v in want.items()}


def digests(path) -> dict[str, str]:
    return {
        str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(path.rglob("*"))
        if f.is_file()
    }


def check_read_back(path, want, precision) -> None:
    g = plain_arrays(path)
    np.testing.assert_array_equal(g["input_ids"][:], want["input_ids"])
    np.testing.assert_array_equal(g["loss_mask"][:], want["loss_mask"].astype(np.uint8))
    for key in ("aux_hidden", "final_hidden"):
        got = g[key][:]
        if precision == "lossless":
            np.testing.assert_array_equal(got, want[key])
        else:  # rounded to 3 mantissa bits: within 2^-4 of each value
            a = (got.astype(np.uint32) << 16).view(np.float32)
            b = (want[key].astype(np.uint32) << 16).view(np.float32)
            assert np.all(np.abs(a - b) <= np.abs(b) * 2.0**-4)


CASES = [(256, 2048), (256, 16384), (4096, 2048)]
if os.environ.get("EYRIE_FULL_TESTS") == "1":
    CASES.append((4096, 16384))  # ~1 GB of states per store: about a minute on one core


@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("precision", ["lossless", "bitround-3"])
@pytest.mark.parametrize(("hidden", "shard"), CASES)
def test_our_shard_files_are_zarrs_bytes(tmp_path, hidden, shard, precision, kind):
    # The commit over two whole shards at hidden 256 only: the shard geometry (2048-token
    # shards of 256-token chunks) is the same at 4096, where it doubled what the case writes
    # (4,101 tokens to 8,270: ~270 MB per encoder) for the same path. Hidden 4096 keeps every
    # other commit, its chunks 16x larger (Blosc's many-block buffers, a real model's rows).
    commits = plan(shard, np.random.default_rng(hidden + shard), over_shards=hidden <= 256)
    aux_rows, fin_rows = rows(hidden, seed=hidden)
    got = {}
    for encoder in ("zarr", "eyrie"):
        path = tmp_path / encoder
        want = write(path, hidden, shard, precision, encoder, commits, aux_rows, fin_rows, kind)
        got[encoder] = digests(path)
        check_read_back(path, want, precision)
    assert len(got["eyrie"]) > 10
    assert got["eyrie"] == got["zarr"]


def small_writer(path, encoder: str, threads: int | str = 1, kind="planes") -> ShardWriter:
    """A hidden-32 writer of 16-token chunks in 64-token shards: many files, many edges.

    A new store gets the layout `kind`; an existing one keeps its own.
    """
    with layout(kind):
        w = open_small(path, encoder, threads)
    check_encoders(w, encoder, kind)
    return w


def open_small(path, encoder: str, threads: int | str) -> ShardWriter:
    """small_writer's store, created or resumed in whatever layout new stores get now."""
    return ShardWriter(
        path,
        hidden_size=32,
        aux_layer_ids=AUX,
        provenance=PROV,
        chunk_tokens=16,
        shard_tokens=64,
        writer_threads=threads,
        shard_encoder=encoder,
    )


@pytest.mark.parametrize("kind", LAYOUTS)
def test_same_bytes_on_several_threads_and_small_chunks(tmp_path, kind):
    """Many short commits into 64-token shards of 16-token chunks, on 1 and 3 threads."""
    aux_rows, fin_rows = rows(32, seed=1)
    got = {}
    for encoder, threads in (("zarr", 1), ("eyrie", 1), ("eyrie", 3)):
        path = tmp_path / f"{encoder}-{threads}"
        with small_writer(path, encoder, threads, kind) as w:
            local = np.random.default_rng(5)
            for i in range(60):
                n = int(local.integers(1, 40))
                w.append(f"s{i}", np.arange(n), np.ones(n, bool), aux_rows[:n], fin_rows[:n])
                if local.random() < 0.4:
                    w.commit()
            w.finish()
        got[(encoder, threads)] = digests(path)
    assert len(got[("zarr", 1)]) > 40
    assert got[("eyrie", 1)] == got[("zarr", 1)] and got[("eyrie", 3)] == got[("zarr", 1)]


@pytest.mark.parametrize("kind", LAYOUTS)
def test_resumed_store_gets_zarrs_bytes(tmp_path, monkeypatch, kind):
    """Data written past the commit (a kill before the record), then a resume: as zarr does.

    The store is created in layout `kind` and resumed by this Eyrie, which keeps its layout
    ("blosc": a store of an older Eyrie, appended to after the upgrade).
    """
    aux_rows, fin_rows = rows(32, seed=2)
    got = {}
    for encoder in ("zarr", "eyrie"):
        path = tmp_path / encoder
        w = small_writer(path, encoder, "auto", kind)
        for i, n in enumerate((20, 30)):
            w.append(f"s{i}", np.arange(n), np.ones(n, bool), aux_rows[:n], fin_rows[:n])
        w.commit()  # 50 tokens, inside shard 0
        for i, n in enumerate((25, 40), start=2):  # to 115: into shard 1, never committed
            w.append(f"s{i}", np.arange(n), np.ones(n, bool), aux_rows[5 : 5 + n], fin_rows[:n])
        commit_killed_before_record(w, monkeypatch)
        # resumes at 50 tokens; shard 0 holds data past them on disk
        w = open_small(path, encoder, "auto")
        check_encoders(w, encoder, kind)  # the store's own layout, whatever new stores get
        assert w.num_tokens == 50
        for i, n in enumerate((9, 3, 70), start=2):
            w.append(f"s{i}", np.arange(n), np.ones(n, bool), aux_rows[9 : 9 + n], fin_rows[:n])
            w.commit()
        w.finish()
        w.close()
        got[encoder] = digests(path)
    assert got["eyrie"] == got["zarr"]
