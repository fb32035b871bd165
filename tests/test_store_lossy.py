"""The store's precision: bitround-N rounds as an independent computation says, is recorded,
and validation applies its tolerance; lossless stores stay bit-exact and read as before."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_target import build_llama, write_split

from eyrie.extract.shard import extract_shard
from eyrie.store.codecs import (
    cosine_bar,
    mantissa_bits,
    max_relative_error,
    round_bf16_bits,
    stored_mantissa_bits,
)
from eyrie.store.shard import ShardReader, ShardWriter, StoreError
from eyrie.validate.settings import validate_settings
from eyrie.validate.shard import validate_shard

ALL = np.arange(1 << 16, dtype=np.uint16)  # every bf16 bit pattern


def reference_round(bits: np.ndarray, keep: int) -> np.ndarray:
    """Round normal bf16 values to `keep` mantissa bits in float64: x / 2^(e-keep), rint (ties
    to even), times 2^(e-keep), where 2^e <= |x| < 2^(e+1). No bit tricks."""
    x = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    _, e = np.frexp(x)  # x = m 2^e with 0.5 <= |m| < 1, so 2^(e-1) <= |x|
    q = np.ldexp(1.0, e - 1 - keep)
    r = np.rint(x / q) * q
    if keep == 0:  # no mantissa bit left: a tie goes to the even exponent field (bit pattern)
        tie = np.abs(x / q) == 1.5
        down = ((bits >> 7) & 1) == 0  # x's own exponent field is even: round towards zero
        r[tie & down] = np.trunc(x / q)[tie & down] * q[tie & down]
    return r


def as_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def test_precision_names():
    assert mantissa_bits("lossless") is None and mantissa_bits(None) is None
    assert mantissa_bits("bitround-4") == 4 and mantissa_bits("bitround-0") == 0
    for bad in ("bitround-7", "bitround--1", "bitround", "fp8", "lossy"):
        with pytest.raises(ValueError, match="bitround-N"):
            mantissa_bits(bad)


@pytest.mark.parametrize("keep", range(7))
def test_rounding_matches_an_independent_computation(keep):
    exp = (ALL >> 7) & 0xFF
    normal = (exp > 0) & (exp < 255)
    got = round_bf16_bits(ALL, keep)
    assert got.dtype == np.uint16 and got.shape == ALL.shape
    assert not (got & ((1 << (7 - keep)) - 1)).any()  # the dropped bits are zero
    ref = reference_round(ALL[normal], keep)
    out = as_f64(got[normal])
    finite = np.abs(ref) < 2.0**128  # values above the largest finite bf16 round to Inf
    assert np.array_equal(out[finite], ref[finite])
    assert np.isinf(out[~finite]).all() and (np.sign(out[~finite]) == np.sign(ref[~finite])).all()
    x = as_f64(ALL[normal])[finite]
    assert (np.abs(out[finite] - x) <= max_relative_error(keep) * np.abs(x)).all()
    # zeros, Inf and exponent-only values are fixed points; already-rounded values too
    assert np.array_equal(round_bf16_bits(got, keep), got)
    for special in (0x0000, 0x8000, 0x7F80, 0xFF80, 0x3F80):
        assert round_bf16_bits(np.array([special], np.uint16), keep)[0] == special


def test_config_key_in_the_schema():
    import yaml

    from eyrie.common.config import ConfigError, check

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "config.yaml").read_text())
    assert check(cfg)["extract"]["precision"] == "lossless"  # the default: off
    cfg["extract"]["precision"] = "bitround-4"
    assert check(cfg)["extract"]["precision"] == "bitround-4"
    for bad in ("bitround-7", "fp8", "bitround-12"):
        cfg["extract"]["precision"] = bad
        with pytest.raises(ConfigError, match="extract.precision"):
            check(cfg)


def test_cosine_bar():
    assert cosine_bar(0.999, None) == 0.999
    bar = cosine_bar(0.999, 4)
    assert bar == pytest.approx(math.cos(math.acos(0.999) + math.asin(1 / 32)))
    assert cosine_bar(0.999, 2) < bar < 0.999  # fewer bits: a lower bar


def _write(path, precision=None, samples=3):
    rng = np.random.default_rng(0)
    kw = {} if precision is None else {"precision": precision}
    data = []
    with ShardWriter(path, hidden_size=64, aux_layer_ids=[0, 1], provenance={"t": 1}, **kw) as w:
        for i in range(samples):
            n = 40 + i
            bits = rng.choice(ALL, size=(n, 3, 64))
            bits[(bits & 0x7F80) == 0x7F80] = 0x3F80  # finite values only
            data.append(bits)
            w.append(f"s{i}", np.arange(n), np.ones(n, bool), bits[:, :2], bits[:, 2])
        w.finish()
    return data


def test_lossy_store_records_precision_and_stores_rounded_bits(tmp_path):
    data = _write(tmp_path / "lossy.zarr", "bitround-3")
    r = ShardReader(tmp_path / "lossy.zarr")
    assert r.attrs["precision"]["kind"] == "bitround"
    assert r.attrs["precision"]["mantissa_bits"] == 3
    assert r.attrs["precision"]["max_relative_error"] == 2.0**-4
    assert stored_mantissa_bits(r.attrs) == 3
    for i, bits in enumerate(data):
        s = r[i]
        stored = s["aux_hidden"].view(torch.int16).numpy().view(np.uint16)
        assert np.array_equal(stored, round_bf16_bits(bits[:, :2], 3))
        assert not np.array_equal(stored, bits[:, :2])
    # resuming at another precision would mix two precisions in one store
    with pytest.raises(StoreError, match="precision"):
        ShardWriter(
            tmp_path / "lossy.zarr", hidden_size=64, aux_layer_ids=[0, 1], provenance={"t": 1}
        )


def test_lossless_store_is_bit_exact_and_unchanged(tmp_path):
    path = tmp_path / "lossless.zarr"
    with ShardWriter(path, hidden_size=256, aux_layer_ids=[0], provenance={}) as w:
        bits = ALL.reshape(256, 256)  # every pattern, NaNs included
        w.append("all", np.arange(256), np.ones(256, bool), bits[:, None, :], bits[::-1].copy())
        w.finish()
    r = ShardReader(path)
    assert r.attrs["precision"] == {"kind": "lossless", "mantissa_bits": 7}
    assert stored_mantissa_bits(r.attrs) is None
    s = r[0]
    assert np.array_equal(s["aux_hidden"].view(torch.int16).numpy().view(np.uint16)[:, 0], bits)
    assert np.array_equal(s["final_hidden"].view(torch.int16).numpy().view(np.uint16), bits[::-1])
    meta = json.loads((path / "aux_hidden" / "zarr.json").read_text())
    inner = meta["codecs"][0]["configuration"]["codecs"]
    assert [c["name"] for c in inner] == ["bytes", "numcodecs.shuffle", "blosc", "crc32c"]
    assert inner[1]["configuration"] == {"elementsize": 2}
    assert inner[2]["configuration"] == {
        "typesize": 1,
        "cname": "zstd",
        "clevel": 1,
        "shuffle": "noshuffle",
        "blocksize": 256 * 256,  # half of a 256-token chunk of one 256-wide layer
    }


def test_store_written_before_the_attribute_reads_as_lossless(tmp_path):
    data = _write(tmp_path / "old.zarr")
    meta_path = tmp_path / "old.zarr" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    del meta["attributes"]["precision"]  # as every store before this attribute
    meta_path.write_text(json.dumps(meta))
    r = ShardReader(tmp_path / "old.zarr")
    assert stored_mantissa_bits(r.attrs) is None
    got = r[1]["final_hidden"].view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(got, data[1][:, 2])
    # a lossless writer resumes it; a lossy one refuses it
    ShardWriter(tmp_path / "old.zarr", hidden_size=64, aux_layer_ids=[0, 1], provenance={"t": 1})
    with pytest.raises(StoreError, match="precision"):
        ShardWriter(
            tmp_path / "old.zarr",
            hidden_size=64,
            aux_layer_ids=[0, 1],
            provenance={"t": 1},
            precision="bitround-4",
        )


def test_unknown_precision_is_refused(tmp_path):
    with pytest.raises(StoreError, match="bitround-N"):
        ShardWriter(
            tmp_path / "x.zarr", hidden_size=8, aux_layer_ids=[0], provenance={}, precision="fp8"
        )
    assert not (tmp_path / "x.zarr").exists()


# ---------------------------------------------------------------------------------------------
# extraction and validation of a lossy store


@pytest.fixture(scope="module")
def lossy(tmp_path_factory):
    root = tmp_path_factory.mktemp("lossy")
    target = build_llama(root / "target", layers=8)
    data = write_split(root / "train.jsonl", 8)
    stores = {}
    for precision in ("lossless", "bitround-2"):
        out = root / precision / "shard-000.zarr"
        extract_shard(
            data_path=data,
            target_path=target,
            split="train",
            shard=0,
            out_store=out,
            errors_csv=out.with_suffix(".csv"),
            capture={"backend": "hf", "aux_layer_ids": None, "device": "cpu", "batch_size": 4},
            extract={"shards": 1, "chunk_tokens": 32, "shard_tokens": 256, "precision": precision},
            max_tokens=80,
            progress=False,
        )
        stores[precision] = out
    return root, target, data, stores


def _validate(lossy, store, **kw):
    _, target, data, _ = lossy
    return validate_shard(
        store=store,
        errors_csv=store.with_suffix(".csv"),
        data_path=data,
        target_path=target,
        split="train",
        shard=0,
        shards=1,
        max_tokens=80,
        settings=validate_settings({"spot_check_samples": 8, "min_greedy_match": 0.5, **kw}),
        device="cpu",
    )


def test_extract_plumbs_precision_and_rounds(lossy):
    stores = lossy[3]
    a, b = ShardReader(stores["lossless"]), ShardReader(stores["bitround-2"])
    assert b.attrs["precision"]["name"] == "bitround-2"
    assert b.attrs["provenance"]["settings"]["extract"]["precision"] == "bitround-2"
    assert a.sample_ids == b.sample_ids
    for i in range(len(a)):
        x = a[i]["aux_hidden"].view(torch.int16).numpy().view(np.uint16)
        y = b[i]["aux_hidden"].view(torch.int16).numpy().view(np.uint16)
        assert np.array_equal(y, round_bf16_bits(x, 2))  # the same states, rounded


def test_validate_applies_the_rounding_tolerance(lossy, tmp_path):
    stores = lossy[3]
    strict = 0.9999
    clean = _validate(lossy, stores["lossless"], min_cosine=strict)
    assert "cosine" not in clean["error_counts"], clean["problems"]
    assert clean["precision"]["kind"] == "lossless" and clean["cosine_bar"] == strict

    rep = _validate(lossy, stores["bitround-2"], min_cosine=strict)
    assert rep["precision"]["mantissa_bits"] == 2
    assert rep["cosine_bar"] == pytest.approx(cosine_bar(strict, 2))
    assert "cosine" not in rep["error_counts"], rep["problems"]
    assert rep["cosine_bar"] < rep["min_cosine"] < strict  # rounding shows, within its bound

    # the same rounded states claimed lossless fail the strict bar: the tolerance did the work
    fake = shutil.copytree(stores["bitround-2"], tmp_path / "claims-lossless.zarr")
    shutil.copy(stores["bitround-2"].with_suffix(".csv"), fake.with_suffix(".csv"))
    meta = json.loads((fake / "zarr.json").read_text())
    del meta["attributes"]["precision"]
    (fake / "zarr.json").write_text(json.dumps(meta))
    bad = _validate(lossy, fake, min_cosine=strict)
    assert bad["error_counts"].get("cosine", 0) >= 1


def test_validate_still_catches_a_wrong_final_state_in_a_lossy_store(lossy, tmp_path):
    import zarr

    stores = lossy[3]
    ok = _validate(lossy, stores["bitround-2"], min_cosine=0.999, min_greedy_match=0.98)
    assert not {"cosine", "greedy"} & set(ok["error_counts"]), ok["problems"]
    assert ok["greedy_match"] >= 0.98  # against the forward's state rounded alike
    bad = shutil.copytree(stores["bitround-2"], tmp_path / "wrong-final.zarr")
    shutil.copy(stores["bitround-2"].with_suffix(".csv"), bad.with_suffix(".csv"))
    group = zarr.open_group(str(bad), mode="r+")
    group["final_hidden"][:] = group["aux_hidden"][:, 2, :]  # a layer output, not the final norm
    r = _validate(lossy, bad, min_cosine=0.999, min_greedy_match=0.98)
    assert r["error_counts"].get("cosine", 0) == 1 and r["error_counts"].get("greedy", 0) == 1
