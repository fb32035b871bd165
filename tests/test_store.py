"""The shard store: bit-exact round trips, the on-disk contract, resume, integrity, compression."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch
import zarr
from synthetic_data import synthetic_activations

from eyrie.store.format import all_finite_bits
from eyrie.store.shard import (
    ShardDataset,
    ShardReader,
    ShardWriter,
    StoreError,
    bf16_bits,
    from_bf16_bits,
)

H, AUX = 32, [1, 3, 5]
K = len(AUX)
PROV = {"target": "toy", "weights_sha256": "ab" * 32, "backend": "hf", "versions": {"zarr": "3"}}


def commit_killed_before_record(w: ShardWriter, monkeypatch) -> None:
    """w.commit() with the process 'killed' just before the commit record is replaced: the
    data files are written, the record is not; the writer is then closed."""

    def die(*_a, **_k):
        raise KeyboardInterrupt("killed before the commit record")

    monkeypatch.setattr(ShardWriter, "_write_commit_record", die)
    with pytest.raises(KeyboardInterrupt):
        w.commit()
    monkeypatch.undo()
    w.close()


def make_sample(i: int, tokens: int | None = None) -> dict:
    """Deterministic ragged sample i, with float32 hidden states (bf16 rounding is exercised)."""
    rng = np.random.default_rng(1000 + i)
    t = int(tokens if tokens is not None else rng.integers(1, 90))
    return {
        "sample_id": f"conv-{i}",
        "input_ids": rng.integers(0, 50_000, t),
        "loss_mask": rng.integers(0, 2, t).astype(bool),
        "aux_hidden": torch.from_numpy(rng.standard_normal((t, K, H)).astype(np.float32) * 3),
        "final_hidden": torch.from_numpy(rng.standard_normal((t, H)).astype(np.float32)),
    }


def f32_to_bf16_bits_reference(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bits, written out by hand (no torch)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def writer(path, **kw) -> ShardWriter:
    args = {"hidden_size": H, "aux_layer_ids": AUX, "provenance": PROV}
    args.update(kw)
    return ShardWriter(path, chunk_tokens=16, shard_tokens=64, **args)


def write_store(path, samples, commit_every=3, finish=True) -> None:
    with writer(path) as w:
        for j, s in enumerate(samples):
            w.append(**s)
            if j % commit_every == commit_every - 1:
                w.commit()
        if finish:
            w.finish()


def bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def bits_t(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def assert_sample_equal(got: dict, want: dict) -> None:
    assert got["sample_id"] == want["sample_id"]
    assert got["input_ids"].dtype == torch.int64 and got["loss_mask"].dtype == torch.bool
    np.testing.assert_array_equal(got["input_ids"].numpy(), want["input_ids"])
    np.testing.assert_array_equal(got["loss_mask"].numpy(), want["loss_mask"])
    for name in ("aux_hidden", "final_hidden"):
        assert got[name].dtype == torch.bfloat16
        ref = f32_to_bf16_bits_reference(want[name].numpy())
        np.testing.assert_array_equal(bits(got[name]), ref)


# -- bfloat16 bits ---------------------------------------------------------------------------


def test_every_bf16_bit_pattern_round_trips():
    patterns = np.arange(1 << 16, dtype=np.uint16)
    t = from_bf16_bits(patterns)
    assert t.dtype == torch.bfloat16
    np.testing.assert_array_equal(bf16_bits(t), patterns)
    # Independent check of the meaning: a bf16 value is the top half of a float32.
    as_f32 = (patterns.astype(np.uint32) << 16).view(np.float32)
    finite = ~np.isnan(as_f32)
    np.testing.assert_array_equal(t.float().numpy()[finite], as_f32[finite])
    assert np.isnan(t.float().numpy()[~finite]).all()


def test_float32_input_is_rounded_to_nearest_even():
    rng = np.random.default_rng(0)
    spread = rng.standard_normal(10_000) * 10.0 ** rng.integers(-40, 38, 10_000)
    ties = (rng.integers(0, 1 << 16, 1000).astype(np.uint32) << 16 | 0x8000).view(np.float32)
    edges = [0.0, -0.0, np.inf, -np.inf, np.finfo(np.float32).max, np.finfo(np.float32).tiny]
    x = np.concatenate([spread.astype(np.float32), ties, np.array(edges, dtype=np.float32)])
    x = x[~np.isnan(x)]  # NaN payloads are not rounded; their patterns are covered above
    np.testing.assert_array_equal(bf16_bits(torch.from_numpy(x)), f32_to_bf16_bits_reference(x))


def test_bf16_helpers_reject_wrong_types():
    with pytest.raises(TypeError):
        bf16_bits(torch.arange(4))
    with pytest.raises(TypeError):
        from_bf16_bits(np.zeros(3, dtype=np.int16))


# -- round trip and the on-disk contract -------------------------------------------------------


def test_round_trip_ragged_samples(tmp_path):
    samples = [make_sample(i) for i in range(11)] + [make_sample(11, tokens=1)]
    write_store(tmp_path / "s", samples)
    r = ShardReader(tmp_path / "s")
    assert len(r) == len(samples)
    lengths = [len(s["input_ids"]) for s in samples]
    np.testing.assert_array_equal(r.offsets, np.concatenate([[0], np.cumsum(lengths)]))
    assert r.num_tokens == sum(lengths)
    assert r.sample_ids == [s["sample_id"] for s in samples]
    assert r.aux_layer_ids == AUX and r.hidden_size == H
    assert r.attrs["provenance"] == PROV and r.attrs["complete"] is True
    for i in np.random.default_rng(0).permutation(len(samples)):
        assert_sample_equal(r[int(i)], samples[i])
    assert r.sample_index("conv-7") == 7
    assert_sample_equal(r[-1], samples[-1])
    with pytest.raises(IndexError):
        r[len(samples)]
    with pytest.raises(KeyError):
        r.sample_index("nope")
    assert r.nbytes_stored() > 0


def test_plain_zarr_reads_the_contract(tmp_path):
    """What another tool sees with zarr alone: names, dtypes, shapes, codecs, attributes, values."""
    samples = [make_sample(i) for i in range(7)]
    write_store(tmp_path / "s", samples)
    g = zarr.open_group(str(tmp_path / "s"), mode="r")
    attrs = g.attrs.asdict()
    assert attrs["eyrie_store_version"] == 1
    assert attrs["aux_layer_ids"] == AUX and attrs["hidden_size"] == H
    assert attrs["layer_convention"] == "output" and attrs["dtype"] == "bfloat16"
    assert attrs["complete"] is True and attrs["provenance"] == PROV
    total = sum(len(s["input_ids"]) for s in samples)
    expect = {
        "input_ids": ("int32", (total,)),
        "loss_mask": ("uint8", (total,)),
        "aux_hidden": ("uint16", (total, K, H)),
        "final_hidden": ("uint16", (total, H)),
        "offsets": ("int64", (len(samples) + 1,)),
    }
    for name, (dtype, shape) in expect.items():
        assert g[name].dtype == np.dtype(dtype), name
        assert g[name].shape == shape, name
    assert g["sample_id"].shape == (len(samples),)
    for name, chunk in (("aux_hidden", (16, K, H)), ("final_hidden", (16, H))):
        assert g[name].chunks == chunk and g[name].shards == (64, *chunk[1:])
        meta = json.loads((tmp_path / "s" / name / "zarr.json").read_text())
        inner = meta["codecs"][0]["configuration"]["codecs"]
        assert [c["name"] for c in inner] == ["bytes", "numcodecs.shuffle", "blosc", "crc32c"]
        assert inner[1]["configuration"] == {"elementsize": 2}  # [low bytes][high bytes]
        blosc = inner[2]["configuration"]
        assert (blosc["cname"], blosc["clevel"], blosc["shuffle"]) == ("zstd", 1, "noshuffle")
        chunk_bytes = 2 * int(np.prod(chunk))
        assert (blosc["typesize"], blosc["blocksize"]) == (1, chunk_bytes // 2)  # a block a plane
    for name, typesize in (("input_ids", 4), ("loss_mask", 1)):  # core Zarr v3 codecs only
        meta = json.loads((tmp_path / "s" / name / "zarr.json").read_text())
        inner = meta["codecs"][0]["configuration"]["codecs"]
        assert [c["name"] for c in inner] == ["bytes", "blosc", "crc32c"]
        blosc = inner[1]["configuration"]
        assert (blosc["shuffle"], blosc["typesize"], blosc["blocksize"]) == (
            "shuffle",
            typesize,
            1 << 20,
        )

    offsets = g["offsets"][:]
    ids = [str(s) for s in g["sample_id"][:]]
    for i, s in enumerate(samples):
        a, b = int(offsets[i]), int(offsets[i + 1])
        assert ids[i] == s["sample_id"]
        np.testing.assert_array_equal(g["input_ids"][a:b], s["input_ids"])
        np.testing.assert_array_equal(g["loss_mask"][a:b], s["loss_mask"].astype(np.uint8))
        aux = g["aux_hidden"][a:b]
        np.testing.assert_array_equal(aux, f32_to_bf16_bits_reference(s["aux_hidden"].numpy()))
        fin = torch.from_numpy(g["final_hidden"][a:b].view(np.int16)).view(torch.bfloat16)
        want_fin = s["final_hidden"].bfloat16().float()
        torch.testing.assert_close(fin.float(), want_fin, rtol=0, atol=0)
    commit = json.loads((tmp_path / "s" / "commit.json").read_text())
    assert (commit["num_samples"], commit["num_tokens"]) == (len(samples), total)


def test_accepts_bf16_tensors_uint16_arrays_and_tensor_ids(tmp_path):
    s = make_sample(0, tokens=5)
    aux_bf16 = s["aux_hidden"].bfloat16()
    with writer(tmp_path / "s") as w:
        w.append(
            "a",
            torch.from_numpy(s["input_ids"]),
            torch.from_numpy(s["loss_mask"]),
            aux_bf16,
            bf16_bits(s["final_hidden"]),
        )
        w.finish()
    got = ShardReader(tmp_path / "s")[0]
    assert torch.equal(bits_t(got["aux_hidden"]), bits_t(aux_bf16))
    assert torch.equal(bits_t(got["final_hidden"]), bits_t(s["final_hidden"].bfloat16()))


@pytest.mark.parametrize("kind", ["bf16", "uint16", "bf16-strided"])
def test_buffered_input_is_copied(tmp_path, kind):
    """A caller reusing its tensors after append must not change what gets stored."""
    s = make_sample(0, tokens=4)
    aux = s["aux_hidden"].bfloat16()
    if kind == "bf16-strided":  # a view with gaps: bf16_bits makes a contiguous copy itself
        aux = torch.cat([aux, aux], dim=2)[:, :, ::2]
    given = bf16_bits(aux) if kind == "uint16" else aux
    want = aux.clone()
    with writer(tmp_path / "s") as w:
        w.append("a", s["input_ids"], s["loss_mask"], given, s["final_hidden"])
        aux.fill_(7.0)
        if kind == "uint16":
            given.fill(0)
        w.finish()
    assert torch.equal(bits_t(ShardReader(tmp_path / "s")[0]["aux_hidden"]), bits_t(want))


def test_handed_over_input_stores_the_same_bytes(tmp_path):
    """append(copy=False) buffers the caller's arrays as they are: the same store, byte for byte."""
    samples = [make_sample(i) for i in range(9)]
    for copy in (True, False):
        with writer(tmp_path / f"c{copy}") as w:
            for s in samples:
                aux, fin = bf16_bits(s["aux_hidden"]), s["final_hidden"].bfloat16()
                w.append(s["sample_id"], s["input_ids"], s["loss_mask"], aux, fin, copy=copy)
            w.finish()
    assert store_bytes(tmp_path / "cFalse") == store_bytes(tmp_path / "cTrue")
    r = ShardReader(tmp_path / "cFalse")
    for i, s in enumerate(samples):
        assert_sample_equal(r[i], s)


def test_finite_check_on_bits_agrees_with_torch_isfinite():
    """all_finite_bits on the uint16 patterns says what torch.isfinite says on the bf16 values."""
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = from_bf16_bits(every)
    finite = torch.isfinite(values).numpy()
    assert [all_finite_bits(every[i : i + 1]) for i in range(every.size)] == finite.tolist()
    big = torch.tensor([3.3895e38, -3.3895e38, 1.0, -0.0], dtype=torch.bfloat16)  # largest finite
    special = [float("inf"), float("-inf"), float("nan"), -float("nan")]
    for x in special:
        t = torch.cat([big, torch.tensor([x], dtype=torch.bfloat16)]).repeat(1000)
        assert not all_finite_bits(bf16_bits(t)) and not bool(torch.isfinite(t).all())
        assert not all_finite_bits(bf16_bits(t.reshape(200, 25))[:, 4::5])  # strided: Inf/NaN
        assert all_finite_bits(bf16_bits(t.reshape(200, 25))[:, ::5])  # strided: only big
    assert all_finite_bits(bf16_bits(big.repeat(1000)))
    assert all_finite_bits(np.zeros((0, 3), dtype=np.uint16))
    with pytest.raises(TypeError, match="uint16"):
        all_finite_bits(np.zeros(3, dtype=np.int16))


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("aux_hidden", torch.zeros(5, K + 1, H), "aux_hidden must have shape"),
        ("final_hidden", torch.zeros(5, H + 1), "final_hidden must have shape"),
        ("final_hidden", np.zeros((5, H), dtype=np.int16), "final_hidden must be a floating"),
        ("input_ids", np.zeros((5, 1), dtype=np.int64), "1-D"),
        ("input_ids", np.zeros(5, dtype=np.float32), "integer"),
        ("input_ids", np.full(5, -1), "token ids"),
        ("loss_mask", np.zeros(4, dtype=bool), "loss_mask has 4 tokens"),
        ("loss_mask", np.full(5, 2), "0/1"),
    ],
)
def test_bad_sample_is_refused_with_its_name(tmp_path, field, value, match):
    s = make_sample(0, tokens=5)
    s[field] = value
    with writer(tmp_path / "s") as w:
        with pytest.raises(StoreError, match=match) as err:
            w.append(**s)
        assert "conv-0" in str(err.value) and str(tmp_path / "s") in str(err.value)
        assert w.buffered_samples == 0


def test_empty_sample_and_bad_parameters_are_refused(tmp_path):
    s = make_sample(0, tokens=5)
    with writer(tmp_path / "s") as w:
        with pytest.raises(StoreError, match="no tokens"):
            empty = np.zeros(0, int)
            w.append("e", empty, empty, torch.zeros(0, K, H), torch.zeros(0, H))
        with pytest.raises(StoreError, match="non-empty str"):
            w.append(**{**s, "sample_id": ""})
    with pytest.raises(StoreError, match="multiple of chunk_tokens"):
        ShardWriter(tmp_path / "t", hidden_size=H, aux_layer_ids=AUX, provenance={},
                    chunk_tokens=10, shard_tokens=64)  # fmt: skip
    with pytest.raises(StoreError, match="repeats a layer"):
        writer(tmp_path / "t", aux_layer_ids=[1, 1])
    with pytest.raises(StoreError, match="plain JSON"):
        writer(tmp_path / "t", provenance={"x": object()})
    assert not (tmp_path / "t").exists()


def test_duplicate_ids_are_refused(tmp_path):
    with writer(tmp_path / "s") as w:
        w.append(**make_sample(0))
        with pytest.raises(StoreError, match="already in this shard"):
            w.append(**make_sample(0))  # still buffered
        w.commit()
        with pytest.raises(StoreError, match="already in this shard"):
            w.append(**make_sample(0))  # committed
    with writer(tmp_path / "s") as w:
        with pytest.raises(StoreError, match="already in this shard"):
            w.append(**make_sample(0))  # committed by an earlier writer
        assert w.committed_ids == ["conv-0"]


def test_non_store_paths_are_refused(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("x")
    with pytest.raises(StoreError, match="not an Eyrie shard store"):
        writer(tmp_path / "junk")
    with pytest.raises(StoreError, match="does not exist"):
        ShardReader(tmp_path / "missing")
    zarr.open_group(str(tmp_path / "other"), mode="w")
    with pytest.raises(StoreError, match="not an Eyrie shard store"):
        ShardReader(tmp_path / "other")
    (tmp_path / "empty").mkdir()  # an empty folder (e.g. made by a workflow engine) is fine
    writer(tmp_path / "empty").close()
    assert ShardReader(tmp_path / "empty", require_complete=False).num_tokens == 0


# -- commit, crash, resume --------------------------------------------------------------------


def test_resume_keeps_only_committed_samples(tmp_path):
    samples = [make_sample(i) for i in range(9)]
    w = writer(tmp_path / "s")
    for s in samples[:4]:
        w.append(**s)
    w.commit()
    for s in samples[4:6]:
        w.append(**s)  # buffered, never committed
    del w  # the writer dies

    with pytest.raises(StoreError, match="incomplete"):
        ShardReader(tmp_path / "s")
    part = ShardReader(tmp_path / "s", require_complete=False)
    assert part.sample_ids == [s["sample_id"] for s in samples[:4]]

    w = writer(tmp_path / "s")
    assert w.committed_ids == [s["sample_id"] for s in samples[:4]]
    assert w.num_samples == 4
    assert w.num_tokens == sum(len(s["input_ids"]) for s in samples[:4])
    for s in samples[4:]:
        w.append(**s)
    w.finish()
    w.close()
    r = ShardReader(tmp_path / "s")
    assert r.sample_ids == [s["sample_id"] for s in samples]
    for i, s in enumerate(samples):
        assert_sample_equal(r[i], s)


def test_data_written_past_the_commit_is_discarded(tmp_path, monkeypatch):
    """Killed after writing data but before the commit record: resume truncates that data."""
    samples = [make_sample(i, tokens=30) for i in range(8)]
    w = writer(tmp_path / "s")
    for s in samples[:3]:
        w.append(**s)
    w.commit()
    for s in samples[3:5]:
        w.append(**s)

    commit_killed_before_record(w, monkeypatch)
    g = zarr.open_group(str(tmp_path / "s"), mode="r")
    assert g["aux_hidden"].shape[0] >= 150  # grown ahead; the uncommitted data reached the disk
    written = np.concatenate([s["input_ids"] for s in samples[3:5]])
    np.testing.assert_array_equal(g["input_ids"][90:150], written)
    part = ShardReader(tmp_path / "s", require_complete=False)
    assert len(part) == 3 and part.num_tokens == 90

    (tmp_path / "s" / "commit.json.0123.eyrie-tmp").write_text("{")  # stray temp file
    w = writer(tmp_path / "s")
    assert w.committed_ids == ["conv-0", "conv-1", "conv-2"]
    g = zarr.open_group(str(tmp_path / "s"), mode="r")
    assert g["aux_hidden"].shape[0] == 90 and g["offsets"].shape == (4,)
    assert not list((tmp_path / "s").glob("*.eyrie-tmp"))
    for s in samples[3:]:
        w.append(**s)
    w.finish()
    w.close()
    r = ShardReader(tmp_path / "s")
    assert len(r) == 8
    for i, s in enumerate(samples):
        assert_sample_equal(r[i], s)


def test_mismatched_store_settings_are_refused(tmp_path):
    write_store(tmp_path / "s", [make_sample(0)], finish=False)
    with pytest.raises(StoreError, match="hidden_size"):
        writer(tmp_path / "s", hidden_size=H * 2)
    with pytest.raises(StoreError, match="aux_layer_ids"):
        writer(tmp_path / "s", aux_layer_ids=[1, 3, 6])
    with pytest.raises(StoreError, match="provenance.*weights_sha256"):
        writer(tmp_path / "s", provenance={**PROV, "weights_sha256": "cd" * 32})
    writer(tmp_path / "s").close()  # same settings resume fine


def test_complete_store_refuses_appends(tmp_path):
    write_store(tmp_path / "s", [make_sample(0)])
    with writer(tmp_path / "s") as w:
        assert w.committed_ids == ["conv-0"]
        w.finish()  # finishing again is harmless
        with pytest.raises(StoreError, match="complete"):
            w.append(**make_sample(1))


def test_exception_inside_context_commits_nothing_more(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with writer(tmp_path / "s") as w:
            w.append(**make_sample(0))
            w.commit()
            w.append(**make_sample(1))
            raise RuntimeError("boom")
    assert ShardReader(tmp_path / "s", require_complete=False).sample_ids == ["conv-0"]
    with writer(tmp_path / "s") as w:
        w.append(**make_sample(1))  # leaving normally commits (but does not finish)
    r = ShardReader(tmp_path / "s", require_complete=False)
    assert r.sample_ids == ["conv-0", "conv-1"] and r.attrs["complete"] is False


def test_one_writer_per_store(tmp_path):
    w = writer(tmp_path / "s")
    with pytest.raises(StoreError, match="another process"):
        writer(tmp_path / "s")
    w.close()
    writer(tmp_path / "s").close()


def test_stale_creation_folder_is_removed(tmp_path):
    stale = tmp_path / ".s.eyrie-tmp-deadbeef"
    stale.mkdir()
    (stale / "zarr.json").write_text("{")
    writer(tmp_path / "s").close()
    assert not stale.exists()


def test_reader_refuses_bad_version(tmp_path):
    write_store(tmp_path / "s", [make_sample(0)])
    meta_path = tmp_path / "s" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["attributes"]["eyrie_store_version"] = 99
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(StoreError, match="version 99"):
        ShardReader(tmp_path / "s")
    with pytest.raises(StoreError, match="version 99"):
        writer(tmp_path / "s")


# -- integrity -----------------------------------------------------------------------------------


def test_corrupted_chunk_raises_on_read(tmp_path):
    samples = [make_sample(i, tokens=40) for i in range(4)]
    write_store(tmp_path / "s", samples)
    shard = tmp_path / "s" / "aux_hidden" / "c" / "0" / "0" / "0"
    clean = shard.read_bytes()
    # The shard index (4 inner chunks x (offset, length) uint64 + crc32c) ends the file.
    index = np.frombuffer(clean[-(4 * 16 + 4) : -4], dtype="<u8").reshape(4, 2)
    start, length = (int(v) for v in index[0])  # inner chunk 0: tokens 0-15
    # Flip bytes all over the chunk: the compressed stream has no checksum of its own, so
    # several of these decode "fine" to wrong values unless crc32c catches them.
    for pos in np.linspace(start, start + length - 1, 25).astype(int):
        raw = bytearray(clean)
        raw[pos] ^= 0x10
        shard.write_bytes(bytes(raw))
        r = ShardReader(tmp_path / "s")  # opening reads only offsets and ids
        with pytest.raises(StoreError, match="corrupted") as err:
            r[0]
        assert "aux_hidden" in str(err.value) and str(tmp_path / "s") in str(err.value)
        assert_sample_equal(r[3], samples[3])  # a sample in other chunks still reads


def test_corrupted_shard_index_raises_on_read(tmp_path):
    write_store(tmp_path / "s", [make_sample(i, tokens=40) for i in range(2)])
    shard = tmp_path / "s" / "final_hidden" / "c" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-10] ^= 0x01  # the shard index sits at the end of the file
    shard.write_bytes(bytes(raw))
    with pytest.raises(StoreError, match="corrupted"):
        ShardReader(tmp_path / "s")[1]


def test_missing_chunk_file_is_refused(tmp_path):
    write_store(tmp_path / "s", [make_sample(i, tokens=40) for i in range(3)])  # 120 tokens
    os.remove(tmp_path / "s" / "input_ids" / "c" / "1")  # tokens 64-119
    with pytest.raises(StoreError, match="missing chunk files"):
        ShardReader(tmp_path / "s")


# -- compression ---------------------------------------------------------------------------------


def test_activation_like_data_compresses_below_080_of_raw(tmp_path):
    hidden, k, rng = 512, 3, np.random.default_rng(0)
    path = tmp_path / "s"
    with ShardWriter(path, hidden_size=hidden, aux_layer_ids=[1, 2, 3], provenance={}) as w:
        for i in range(6):
            aux, fin = synthetic_activations(rng, 400, k, hidden)
            w.append(f"s{i}", rng.integers(0, 32_000, 400), np.ones(400, bool), aux, fin)
        w.finish()
    r = ShardReader(path)
    raw_per_token = (k + 1) * hidden * 2
    stored_per_token = r.nbytes_stored() / r.num_tokens
    assert stored_per_token < 0.8 * raw_per_token, stored_per_token / raw_per_token
    aux, _ = synthetic_activations(np.random.default_rng(0), 400, k, hidden)
    assert torch.equal(bits_t(r[0]["aux_hidden"]), bits_t(aux))  # lossless


# -- dataset ---------------------------------------------------------------------------------------


def test_dataset_over_shards_with_workers(tmp_path):
    a = [make_sample(i) for i in range(5)]
    b = [make_sample(i) for i in range(5, 12)]
    write_store(tmp_path / "a", a)
    write_store(tmp_path / "b", b)
    ds = ShardDataset([tmp_path / "a", tmp_path / "b"])
    assert len(ds) == 12 and ds.locate(6) == (1, 1)
    assert_sample_equal(ds[6], b[1])
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._readers == {} and len(clone) == 12
    assert_sample_equal(clone[11], b[6])
    loader = torch.utils.data.DataLoader(ds, batch_size=None, shuffle=True, num_workers=2)
    seen = {s["sample_id"]: s for s in loader}
    assert sorted(seen) == sorted(s["sample_id"] for s in a + b)
    for s in a + b:
        assert_sample_equal(seen[s["sample_id"]], s)


def test_dataset_refuses_incomplete_store(tmp_path):
    write_store(tmp_path / "a", [make_sample(0)])
    write_store(tmp_path / "b", [make_sample(1)], finish=False)
    with pytest.raises(StoreError, match="incomplete"):
        ShardDataset([tmp_path / "a", tmp_path / "b"])
    assert len(ShardDataset([tmp_path / "a", tmp_path / "b"], require_complete=False)) == 2


# -- writing on several threads (extract.writer_threads) -------------------------------------


def store_bytes(path) -> dict[str, bytes]:
    files = sorted(f for f in path.rglob("*") if f.is_file())
    return {str(f.relative_to(path)): f.read_bytes() for f in files}


@pytest.mark.parametrize("precision", ["lossless", "bitround-3"])
def test_any_thread_count_writes_the_same_bytes(tmp_path, precision):
    """Every file of the store is byte for byte the same for 1, 2 and 5 threads."""
    samples = [make_sample(i) for i in range(23)]  # commits spanning several 64-token shards
    got = {}
    for threads in (1, 2, 5):
        path = tmp_path / f"t{threads}"
        with writer(path, writer_threads=threads, precision=precision) as w:
            assert w.writer_threads == threads
            for j, s in enumerate(samples):
                w.append(**s)
                if j % 7 == 6:
                    w.commit()
            w.finish()
        got[threads] = store_bytes(path)
    assert len(got[1]) > 20
    assert got[2] == got[1] and got[5] == got[1]
    if precision == "lossless":
        r = ShardReader(tmp_path / "t5")
        for i, s in enumerate(samples):
            assert_sample_equal(r[i], s)


def test_writer_threads_setting_is_checked(tmp_path):
    from eyrie.store.parallel import AUTO_MAX, cores, resolve_threads

    assert resolve_threads("auto") == max(1, min(AUTO_MAX, cores()))
    assert resolve_threads(3) == 3
    for bad in (0, -1, "eight", 2.5, True):
        with pytest.raises(StoreError, match="writer_threads"):
            writer(tmp_path / "s", writer_threads=bad)


@pytest.mark.parametrize("encoder", ["eyrie", "zarr"])
def test_failed_piece_of_a_threaded_commit_commits_nothing(tmp_path, monkeypatch, encoder):
    """One shard file's write fails: the commit raises after every piece ended, no record."""
    from eyrie.store.parallel import Pool
    from eyrie.store.shard_files import TokenShardFiles

    samples = [make_sample(i, tokens=40) for i in range(6)]
    w = writer(tmp_path / "s", writer_threads=4, shard_encoder=encoder)
    for s in samples[:2]:
        w.append(**s)
    w.commit()
    for s in samples[2:]:
        w.append(**s)
    real_setitem, real_write = Pool.setitem, TokenShardFiles.write

    def flaky_setitem(self, arr, selection, value):
        if arr.path == "final_hidden" and selection.start >= 128:
            raise OSError("disk full (simulated)")
        return real_setitem(self, arr, selection, value)

    def flaky_write(self, name, lo, hi, gather):
        if name == "final_hidden" and lo >= 128:
            raise OSError("disk full (simulated)")
        return real_write(self, name, lo, hi, gather)

    monkeypatch.setattr(Pool, "setitem", flaky_setitem)
    monkeypatch.setattr(TokenShardFiles, "write", flaky_write)
    with pytest.raises(OSError, match="disk full"):
        w.commit()
    monkeypatch.undo()
    w.close()
    part = ShardReader(tmp_path / "s", require_complete=False)
    assert len(part) == 2 and part.num_tokens == 80
    w = writer(tmp_path / "s", writer_threads=4, shard_encoder=encoder)
    assert w.committed_ids == ["conv-0", "conv-1"]
    for s in samples[2:]:
        w.append(**s)
    w.finish()
    w.close()
    r = ShardReader(tmp_path / "s")
    for i, s in enumerate(samples):
        assert_sample_equal(r[i], s)


def test_auto_shard_tokens_keeps_shard_files_near_64_mib():
    """Against a brute-force search over every multiple of chunk_tokens by powers of two."""
    from eyrie.store.codecs import shard_tokens_for

    cases = [(256, 128, 3), (256, 256, 3), (256, 4096, 3), (256, 7168, 3), (256, 16384, 3),
             (64, 4096, 1), (512, 4096, 4), (32, 64, 3)]  # fmt: skip
    for chunk, hidden, k in cases:
        fits = [chunk * 2**n for n in range(12)
                if chunk * 2**n <= 4096 and chunk * 2**n * 2 * k * hidden <= 64 << 20]  # fmt: skip
        assert shard_tokens_for("auto", chunk, hidden, k) == max(fits, default=chunk)
    assert shard_tokens_for("auto", 256, 4096, 3) == 2048  # Llama-8B width, EAGLE-3's 3 layers
    assert shard_tokens_for("auto", 256, 128, 3) == 4096  # the toys: about half a commit group
    assert shard_tokens_for(512, 256, 4096, 3) == 512  # a number is taken as given


def _file_bytes(path) -> dict[str, bytes]:
    return {
        str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()
    }


def test_arrays_grown_ahead_leave_no_trace_in_the_finished_store(tmp_path, monkeypatch):
    """Commits grow the arrays ahead (a zarr.json written once in several commits); the
    finished store holds the same bytes, file for file, as one grown only as far as each
    commit needs, which rewrites zarr.json more often."""
    import eyrie.store.writer as writer_module

    samples = [make_sample(i) for i in range(20)]
    resized = []
    real_resize = zarr.Array.resize
    monkeypatch.setattr(
        zarr.Array, "resize", lambda a, s: (resized.append(a.path), real_resize(a, s))
    )
    write_store(tmp_path / "ahead", samples, commit_every=2)
    ahead_resizes = resized.count("aux_hidden")  # growths and the trim at finish
    monkeypatch.setattr(writer_module, "GROW_AHEAD", 0)
    write_store(tmp_path / "exact", samples, commit_every=2)
    exact_resizes = resized.count("aux_hidden") - ahead_resizes
    commits = 10
    assert 0 < ahead_resizes < commits and ahead_resizes < exact_resizes
    ahead, exact = _file_bytes(tmp_path / "ahead"), _file_bytes(tmp_path / "exact")
    assert ahead.keys() == exact.keys() and ahead == exact
    r = ShardReader(tmp_path / "ahead")
    assert r.num_tokens == sum(len(s["input_ids"]) for s in samples)
    g = zarr.open_group(str(tmp_path / "ahead"), mode="r")
    assert g["aux_hidden"].shape[0] == r.num_tokens and g["offsets"].shape == (21,)


def test_a_commit_fsyncs_only_the_folders_whose_names_changed(tmp_path, monkeypatch):
    """Each written file's folder, and the parent of a folder the commit made; never the
    folders above them (their names did not change)."""
    import eyrie.store.format as fmt

    w = writer(tmp_path / "s")
    for i in range(2):
        w.append(**make_sample(i, tokens=20))
    w.commit()  # tokens [0, 40): shard file 0 of every token array exists now
    synced = []
    real = fmt.fsync
    monkeypatch.setattr(fmt, "fsync", lambda p: (synced.append(p), real(p)))
    w.append(**make_sample(2, tokens=10))  # tokens [40, 50): still shard file 0
    w.commit()
    store = tmp_path / "s"
    folders = {p.relative_to(store).as_posix() for p in synced if p.is_dir()}
    assert folders == {
        ".",
        "input_ids/c",
        "loss_mask/c",
        "aux_hidden/c/0/0",
        "final_hidden/c/0",
        "offsets/c",
        "sample_id/c",
    }  # "." : commit.json's own replace
    synced.clear()
    w.append(**make_sample(3, tokens=30))  # tokens [50, 80): shard file 1 is made
    w.commit()
    folders = {p.relative_to(store).as_posix() for p in synced if p.is_dir()}
    assert {"aux_hidden/c", "aux_hidden/c/1", "aux_hidden/c/1/0", "final_hidden/c"} <= folders
    assert "aux_hidden" not in folders and "aux_hidden/c/0/0" in folders
    w.close()
