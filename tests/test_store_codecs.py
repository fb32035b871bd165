"""The bf16 arrays' codec pipeline: byte planes as separate zstd streams (eyrie/store/codecs.py).

A new store's ``aux_hidden`` and ``final_hidden`` with chunks under 512 KiB (the toys', the
targets here) are ``bytes -> numcodecs.shuffle(2) -> blosc (zstd-1, noshuffle, typesize 1,
blocks of half the chunk) -> crc32c``; larger chunks, and every chunk of older stores, have
``bytes -> blosc (byte shuffle, typesize 2, 1 MiB blocks) -> crc32c``. Checked here: the new
pipeline as zarr writes it (metadata, the chunks' Blosc frames, plain zarr reads), Eyrie's
numpy byte planes against numcodecs' Shuffle, Eyrie's shard-file encoder against zarr's bytes
in both layouts, an old-layout store read, validated and resumed by this Eyrie, and the one
numcodecs warning silenced on Eyrie's opens only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import warnings
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import torch
import zarr
from tiny_target import build_llama, write_split
from zarr.codecs.numcodecs import Shuffle

from eyrie.store import codecs
from eyrie.store.codecs import (
    BLOSC_BLOCKSIZE,
    PLANES_BELOW,
    blosc_compressors,
    byte_planes,
    create_arrays,
    from_byte_planes,
    hidden_compressors,
    plane_compressors,
)
from eyrie.store.format import quiet_numcodecs
from eyrie.store.shard import ShardReader, ShardWriter
from eyrie.store.shard_files import ShardFileEncoder
from eyrie.validate.problems import Problems
from eyrie.validate.store import check_structure, check_values, iter_samples, open_raw

AUX = [0, 1, 2]
K = len(AUX)
H = 48
PROV = {"target": "codecs-test"}
NUMCODECS_WARNING = "Numcodecs codecs are not in the Zarr version 3 specification"
PLANES = [
    {"name": "bytes", "configuration": {"endian": "little"}},
    {"name": "numcodecs.shuffle", "configuration": {"elementsize": 2}},
    {"name": "blosc", "configuration": None},  # filled in per array (its block size)
    {"name": "crc32c"},
]


@contextlib.contextmanager
def forced_layout(make):
    """Stores created inside get `make(chunk_bytes)` as their bf16 arrays' pipeline."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(codecs, "hidden_compressors", make)
        yield


def old_layout():
    """Stores created inside get the bf16 pipeline of stores written before the byte planes."""
    return forced_layout(lambda chunk_bytes: blosc_compressors(2))


def layout(name: str):
    """The bf16 layout of stores created inside, at any chunk size: "planes" (the default
    under 512 KiB chunks) or "blosc" (the default from 512 KiB, and every older store's)."""
    return old_layout() if name == "blosc" else forced_layout(plane_compressors)


def inner_codecs(array_folder: Path) -> list[dict]:
    meta = json.loads((array_folder / "zarr.json").read_text())
    return meta["codecs"][0]["configuration"]["codecs"]


def blosc_config(typesize, shuffle, blocksize) -> dict:
    return {
        "typesize": typesize,
        "cname": "zstd",
        "clevel": 1,
        "shuffle": shuffle,
        "blocksize": blocksize,
    }


def bf16_like(shape, seed: int) -> np.ndarray:
    """Finite bf16 patterns of varied exponents and signs, as activations have."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_t(5, size=shape) * 2.0).astype(np.float32)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).numpy().view(np.uint16)


def digests(path: Path) -> dict[str, str]:
    return {
        str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(path.rglob("*"))
        if f.is_file()
    }


@contextlib.contextmanager
def zarr_warning_expected():
    """Plain zarr warns about numcodecs.shuffle whenever it makes one: expected here, not shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=NUMCODECS_WARNING)
        yield


def plain_arrays(path: Path) -> dict[str, zarr.Array]:
    """The token arrays as plain zarr opens them."""
    with zarr_warning_expected():
        g = zarr.open_group(str(path), mode="r")
        return {name: g[name] for name in ("input_ids", "loss_mask", "aux_hidden", "final_hidden")}


def new_group(path: Path, chunk: int, shard: int) -> zarr.Group:
    group = zarr.open_group(zarr.storage.LocalStore(str(path)), mode="w-", zarr_format=3)
    create_arrays(group, K, H, chunk, shard)
    return group


def shard_chunks(shard_file: Path, per_shard: int) -> list[bytes | None]:
    """The encoded inner chunks of a shard file (crc32c included), from its index."""
    data = shard_file.read_bytes()
    index = np.frombuffer(data[-16 * per_shard - 4 : -4], dtype="<u8").reshape(-1, 2)
    return [None if o == 2**64 - 1 else data[int(o) : int(o + n)] for o, n in index]


def blosc_header(frame: bytes) -> dict:
    """c-blosc 1 frame header: flags, typesize, raw bytes, block size."""
    nbytes, blocksize, cbytes = np.frombuffer(frame[4:16], dtype="<u4").tolist()
    return {"flags": frame[2], "typesize": frame[3], "nbytes": nbytes, "blocksize": blocksize}


# ---------------------------------------------------------------------------------------------
# the pipeline, as zarr writes and reads it


def test_new_pipeline_in_metadata_and_chunks_and_plain_zarr_round_trip(tmp_path):
    chunk, shard, t = 32, 128, 300  # t: two whole shard files and a partial one
    group = new_group(tmp_path / "s", chunk, shard)
    for name, tail in (("aux_hidden", (K, H)), ("final_hidden", (H,))):
        want = [dict(c) for c in PLANES]
        want[2]["configuration"] = blosc_config(1, "noshuffle", chunk * int(np.prod(tail)))
        assert inner_codecs(tmp_path / "s" / name) == want, name
    for name, size in (("input_ids", 4), ("loss_mask", 1)):  # core Zarr v3 codecs only
        got = inner_codecs(tmp_path / "s" / name)
        assert [c["name"] for c in got] == ["bytes", "blosc", "crc32c"], name
        assert got[1]["configuration"] == blosc_config(size, "shuffle", BLOSC_BLOCKSIZE), name

    aux, fin = bf16_like((t, K, H), 1), bf16_like((t, H), 2)
    ids = np.random.default_rng(3).integers(0, 128_000, t).astype(np.int32)
    for name, values in (("aux_hidden", aux), ("final_hidden", fin), ("input_ids", ids)):
        with zarr_warning_expected():
            arr = group[name]
        arr.resize(values.shape)
        arr[:] = values
    g = plain_arrays(tmp_path / "s")
    np.testing.assert_array_equal(g["aux_hidden"][:], aux)
    np.testing.assert_array_equal(g["final_hidden"][:], fin)
    np.testing.assert_array_equal(g["input_ids"][:], ids)
    np.testing.assert_array_equal(g["aux_hidden"][37:211], aux[37:211])  # partial chunks

    # each inner chunk: one Blosc frame of two blocks (low bytes, high bytes), no shuffle in
    # Blosc; its raw bytes are the low-byte plane of the chunk's values, then the high-byte one
    for name, values in (("aux_hidden", aux), ("final_hidden", fin)):
        frames = shard_chunks(
            tmp_path / "s" / name / ("c/0/0/0" if values.ndim == 3 else "c/0/0"), 4
        )
        for i, frame in enumerate(frames):
            part = values[i * chunk : (i + 1) * chunk]
            head = blosc_header(frame[:-4])
            assert head["typesize"] == 1 and head["flags"] & 0x05 == 0  # no (bit)shuffle
            assert head["nbytes"] == part.nbytes and head["blocksize"] == part.nbytes // 2
            raw = np.frombuffer(numcodecs.Blosc().decode(frame[:-4]), np.uint8)
            n = part.size
            np.testing.assert_array_equal(raw[:n], (part.reshape(-1) & 0xFF).astype(np.uint8))
            np.testing.assert_array_equal(raw[n:], (part.reshape(-1) >> 8).astype(np.uint8))
            assert raw.tobytes() == byte_planes(part).tobytes()


def test_plane_compressors_split_the_chunk_in_two_blocks():
    shuffle, blosc, crc = plane_compressors(2 * 256 * 3 * 4096)
    assert shuffle.to_dict() == {"name": "numcodecs.shuffle", "configuration": {"elementsize": 2}}
    assert blosc.to_dict()["configuration"] == blosc_config(1, "noshuffle", 256 * 3 * 4096)
    assert crc.to_dict() == {"name": "crc32c"}
    for make in (plane_compressors, hidden_compressors):
        for bad in (0, 1, 7):
            with pytest.raises(ValueError, match="even"):
                make(bad)


def test_hidden_compressors_take_the_planes_only_for_small_chunks():
    """Planes below PLANES_BELOW (the toys' chunks), Blosc's own byte shuffle from it (a
    256-token chunk at hidden 4096), where the planes gain < 0.5 % and decode slower."""
    toy_aux, toy_final = 2 * 256 * 3 * 256, 2 * 256 * 256  # toy-llama's 384 KiB, 128 KiB
    for small in (toy_aux, toy_final, PLANES_BELOW - 2):
        names = [c.to_dict()["name"] for c in hidden_compressors(small)]
        assert names == ["numcodecs.shuffle", "blosc", "crc32c"], small
    for large in (PLANES_BELOW, 2 * 256 * 3 * 4096, 2 * 256 * 4096):
        got = [c.to_dict() for c in hidden_compressors(large)]
        assert got == [c.to_dict() for c in blosc_compressors(2)], large
        assert got[0]["configuration"]["shuffle"] == "shuffle"


def test_a_store_of_a_wide_target_keeps_blosc_byte_shuffle(tmp_path):
    """create_arrays passes each array's own chunk size: at hidden 1024 both bf16 arrays' chunks
    are 512 KiB or more, so neither gets the planes; at the toy's 256 both do."""
    for hidden, want in ((1024, "blosc"), (256, "numcodecs.shuffle")):
        group = zarr.open_group(str(tmp_path / f"h{hidden}.zarr"), mode="w")
        with quiet_numcodecs():
            create_arrays(group, k=3, hidden=hidden, chunk_tokens=256, shard_tokens=256)
            for name in ("aux_hidden", "final_hidden"):
                inner = group[name].metadata.codecs[0].codecs
                assert inner[1].to_dict()["name"] == want, (hidden, name)


def test_planes_compress_better_than_blosc_byte_shuffle():
    """On activation-like bf16 the planes' two streams beat one stream of the shuffled block, in
    a chunk of the toys' size (384 KiB; from about 1 MiB the two are within 1 %, RESULTS.md)."""
    x = bf16_like((256, K, 256), 4)
    old = numcodecs.Blosc("zstd", 1, numcodecs.Blosc.SHUFFLE, blocksize=BLOSC_BLOCKSIZE)
    new = numcodecs.Blosc("zstd", 1, numcodecs.Blosc.NOSHUFFLE, blocksize=x.nbytes // 2)
    assert len(new.encode(byte_planes(x))) < 0.99 * len(old.encode(x))  # 0.971 (real: < 0.95)


# ---------------------------------------------------------------------------------------------
# numpy's byte planes are numcodecs' Shuffle


@pytest.mark.parametrize(
    "values",
    [
        np.arange(1 << 16, dtype=np.uint16).reshape(256, 256),  # every bf16 pattern
        bf16_like((32, K, 7), 5),
        bf16_like((64, 33), 6)[:, ::2],  # a strided view: planes of its values, in order
        np.array([0xABCD], dtype=np.uint16),
    ],
    ids=["all-patterns", "chunk", "strided", "one"],
)
def test_byte_planes_are_numcodecs_shuffle(values):
    planes = byte_planes(values)
    shuffled = numcodecs.Shuffle(elementsize=2).encode(np.ascontiguousarray(values))
    assert planes.flags.c_contiguous and planes.shape == (2, values.size)
    assert planes.tobytes() == np.asarray(shuffled).tobytes()
    flat = values.reshape(-1)
    np.testing.assert_array_equal(planes[0], (flat & 0xFF).astype(np.uint8))  # low bytes first
    np.testing.assert_array_equal(planes[1], (flat >> 8).astype(np.uint8))
    back = from_byte_planes(planes.tobytes(), np.uint16, values.shape)
    np.testing.assert_array_equal(back, values)
    unshuffled = numcodecs.Shuffle(elementsize=2).decode(np.asarray(shuffled))
    np.testing.assert_array_equal(
        np.asarray(unshuffled).view(np.uint16).reshape(values.shape), values
    )
    if values.size > 1:  # the data tells the planes apart: a swap could not pass
        assert planes[::-1].tobytes() != planes.tobytes()


def test_byte_planes_of_wider_items_and_errors():
    x = np.random.default_rng(7).integers(-(2**31), 2**31, (9, 5), dtype=np.int32)
    assert byte_planes(x, 4).tobytes() == np.asarray(numcodecs.Shuffle(4).encode(x)).tobytes()
    np.testing.assert_array_equal(from_byte_planes(byte_planes(x, 4), np.int32, x.shape, 4), x)
    with pytest.raises(ValueError, match="whole number"):
        byte_planes(np.zeros(3, np.uint8), 2)
    with pytest.raises(ValueError, match="whole number"):
        from_byte_planes(b"abc", np.uint16, (1,))


# ---------------------------------------------------------------------------------------------
# Eyrie's shard-file encoder writes zarr's bytes, in both layouts


WRITES = [(0, 20), (20, 32), (32, 100), (100, 128), (128, 129), (129, 250), (250, 256), (256, 300)]


@pytest.mark.parametrize("kind", ["planes", "blosc"])
def test_shard_file_encoder_writes_zarrs_bytes(tmp_path, kind):
    """The same writes (inside chunks, on chunk and shard edges) by zarr and by the encoder."""
    chunk, shard, t = 32, 128, 300
    values = {"aux_hidden": bf16_like((t, K, H), 8), "final_hidden": bf16_like((t, H), 9)}
    values["input_ids"] = np.random.default_rng(10).integers(0, 128_000, t).astype(np.int32)
    values["loss_mask"] = np.random.default_rng(11).integers(0, 2, t).astype(np.uint8)
    for who in ("zarr", "eyrie"):
        with layout(kind):
            group = new_group(tmp_path / who, chunk, shard)
        for name, v in values.items():
            with zarr_warning_expected():
                arr = group[name]
            arr.resize(v.shape)
            if who == "eyrie":
                enc = ShardFileEncoder(arr, tmp_path / who / name)
                assert enc.planes == (2 if kind == "planes" and v.dtype == np.uint16 else None)
            for lo, hi in WRITES:
                if who == "zarr":
                    arr[lo:hi] = v[lo:hi]
                else:
                    enc.write(lo, hi, lambda a, b, v=v: v[a:b])
    got = {who: digests(tmp_path / who) for who in ("zarr", "eyrie")}
    assert len(got["eyrie"]) == len(got["zarr"]) > 12
    assert got["eyrie"] == got["zarr"]
    names = [c["name"] for c in inner_codecs(tmp_path / "eyrie" / "aux_hidden")]
    assert ("numcodecs.shuffle" in names) == (kind == "planes")
    g = plain_arrays(tmp_path / "eyrie")
    for name, v in values.items():
        np.testing.assert_array_equal(g[name][:], v)


def test_encoder_reads_back_a_partial_chunk_in_both_layouts(tmp_path):
    """A partly written chunk on disk (no kept state): decoded from its planes, then merged."""
    chunk, shard = 32, 128
    v = bf16_like((100, H), 12)
    for kind in ("planes", "blosc"):
        with layout(kind):
            group = new_group(tmp_path / kind, chunk, shard)
        with zarr_warning_expected():
            arr = group["final_hidden"]
        arr.resize(v.shape)
        arr[0:50] = v[0:50]  # zarr writes chunk 1 half full
        fresh = ShardFileEncoder(arr, tmp_path / kind / "final_hidden")  # reads the file
        fresh.write(50, 100, lambda a, b: v[a:b])
        np.testing.assert_array_equal(plain_arrays(tmp_path / kind)["final_hidden"][:], v)


# ---------------------------------------------------------------------------------------------
# stores written before: read, validated, resumed


def writer(path: Path, encoder: str = "eyrie") -> ShardWriter:
    return ShardWriter(
        path,
        hidden_size=H,
        aux_layer_ids=AUX,
        provenance=PROV,
        chunk_tokens=16,
        shard_tokens=64,
        writer_threads=1,
        shard_encoder=encoder,
    )


def append(w: ShardWriter, i: int, n: int, want: list) -> None:
    rng = np.random.default_rng(100 + i)
    ids, mask = rng.integers(0, 128_000, n), np.ones(n, bool)
    aux, fin = bf16_like((n, K, H), 200 + i), bf16_like((n, H), 300 + i)
    w.append(f"s{i}", ids, mask, aux, fin)
    want.append((f"s{i}", ids, aux, fin))


def test_old_layout_store_is_read_validated_and_resumed(tmp_path):
    """An interrupted store of the old layout: this Eyrie resumes it (its encoder, zarr's bytes,
    the old pipeline kept), reads every sample back and validates it clean."""
    got, samples = {}, {}
    for encoder in ("zarr", "eyrie"):
        path, want = tmp_path / encoder, []
        with old_layout():
            w = writer(path, encoder)
        for i, n in enumerate((20, 30, 5)):
            append(w, i, n, want)
        w.commit()  # 55 tokens: inside shard 0, inside chunk 3
        w.close()
        before = {name: inner_codecs(path / name) for name in ("aux_hidden", "final_hidden")}
        assert [c["name"] for c in before["aux_hidden"]] == ["bytes", "blosc", "crc32c"]
        assert before["aux_hidden"][1]["configuration"] == blosc_config(2, "shuffle", 1 << 20)

        w = writer(path, encoder)  # this Eyrie, on the old store
        assert w.num_tokens == 55
        if encoder == "eyrie":  # the encoder takes the old layout (no fallback to zarr)
            encoders = w._shard_files.encoders
            assert {name: e.planes for name, e in encoders.items()} == dict.fromkeys(encoders)
        else:
            assert w._shard_files is None
        for i, n in enumerate((9, 70, 1), start=3):
            append(w, i, n, want)
            w.commit()
        w.finish()
        w.close()
        assert {name: inner_codecs(path / name) for name in before} == before
        got[encoder], samples[encoder] = digests(path), want
    assert got["eyrie"] == got["zarr"]

    path, want = tmp_path / "eyrie", samples["eyrie"]
    r = ShardReader(path)
    assert len(r) == len(want)
    for i, (sid, ids, aux, fin) in enumerate(want):
        s = r[i]
        assert s["sample_id"] == sid
        np.testing.assert_array_equal(s["input_ids"].numpy(), ids)
        np.testing.assert_array_equal(bits(s["aux_hidden"]), aux)
        np.testing.assert_array_equal(bits(s["final_hidden"]), fin)
    p = Problems()
    raw = open_raw(path, p)
    assert raw is not None and check_structure(raw, AUX, H, p)
    seen = []
    for _, sid, arrays in iter_samples(raw, p):
        check_values(sid, arrays, None, p)
        seen.append(sid)
    assert seen == [sid for sid, *_ in want]
    assert p.rows == []


def test_old_layout_extraction_validates_clean(tmp_path):
    """A shard extracted in the old layout passes this Eyrie's whole validation."""
    from eyrie.extract.shard import extract_shard
    from eyrie.validate.settings import validate_settings
    from eyrie.validate.shard import validate_shard

    target = build_llama(tmp_path / "target", layers=8)
    data = write_split(tmp_path / "train.jsonl", 8)
    store, errors = tmp_path / "shard-000.zarr", tmp_path / "shard-000.errors.csv"
    common = {"data_path": data, "target_path": target, "split": "train", "shard": 0}
    with old_layout():
        extract_shard(
            **common,
            out_store=store,
            errors_csv=errors,
            capture={"backend": "hf", "aux_layer_ids": None, "device": "cpu", "batch_size": 4},
            extract={"shards": 1, "chunk_tokens": 32, "shard_tokens": 128},
            max_tokens=80,
            progress=False,
        )
    assert [c["name"] for c in inner_codecs(store / "aux_hidden")] == ["bytes", "blosc", "crc32c"]
    report = validate_shard(
        **common,
        store=store,
        errors_csv=errors,
        shards=1,
        max_tokens=80,
        settings=validate_settings({"spot_check_samples": 3, "min_greedy_match": 0.9}),
        device="cpu",
    )
    assert report["samples"] == 8 and len(report["spot_checked"]) == 3
    assert report["error_counts"] == {}, report["problems"][:5]


# ---------------------------------------------------------------------------------------------
# the numcodecs warning: silenced on Eyrie's own creates and opens, nowhere else


def test_eyrie_opens_without_the_numcodecs_warning_and_others_still_get_it(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        filters = list(warnings.filters)
        w = writer(tmp_path / "s")
        append(w, 0, 40, [])
        w.commit()
        w.close()
        w = writer(tmp_path / "s")  # resumed: the arrays' metadata read again
        w.finish()
        w.close()
        ShardReader(tmp_path / "s")
        p = Problems()
        assert open_raw(tmp_path / "s", p) is not None and p.rows == []
        assert warnings.filters == filters  # no filter left behind
        with pytest.raises(UserWarning, match=NUMCODECS_WARNING):  # plain zarr still warns
            zarr.open_group(str(tmp_path / "s"), mode="r")["aux_hidden"]
        with pytest.raises(UserWarning, match=NUMCODECS_WARNING):
            Shuffle(elementsize=2)
