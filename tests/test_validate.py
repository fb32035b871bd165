"""Validation: a clean extraction passes, and each kind of damage is caught and named."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from tiny_target import build_llama, write_split

from eyrie.common.atomic import write_json
from eyrie.extract.shard import extract_shard
from eyrie.store.shard import ShardReader, ShardWriter
from eyrie.validate.settings import validate_settings
from eyrie.validate.shard import validate_shard
from eyrie.validate.summary import summarize

N = 20
MAX_TOKENS = 80
CAPTURE = {"backend": "hf", "aux_layer_ids": None, "device": "cpu", "batch_size": 4}
EXTRACT = {"shards": 2, "chunk_tokens": 32, "shard_tokens": 256}
NAN, ZERO = 0x7FC0, 0


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("validate")
    target = build_llama(root / "target", layers=8)
    data = write_split(root / "train.jsonl", N)
    for shard in (0, 1):
        extract_shard(
            data_path=data,
            target_path=target,
            split="train",
            shard=shard,
            out_store=root / f"shard-{shard:03d}.zarr",
            errors_csv=root / f"shard-{shard:03d}.errors.csv",
            capture=CAPTURE,
            extract=EXTRACT,
            max_tokens=MAX_TOKENS,
            progress=False,
        )
    return root, target, data


def copy_shard(clean, dst: Path, shard: int = 0) -> tuple[Path, Path]:
    root = clean[0]
    store = shutil.copytree(root / f"shard-{shard:03d}.zarr", dst / f"shard-{shard:03d}.zarr")
    errors = shutil.copy(root / f"shard-{shard:03d}.errors.csv", dst / f"shard-{shard:03d}.csv")
    return Path(store), Path(errors)


def check(clean, store, errors, shard=0, spot_check_samples=3, **kw) -> dict:
    _, target, data = clean
    return validate_shard(
        store=store,
        errors_csv=errors,
        data_path=data,
        target_path=target,
        split="train",
        shard=shard,
        shards=2,
        max_tokens=MAX_TOKENS,
        settings=validate_settings(
            {"spot_check_samples": spot_check_samples, "min_greedy_match": 0.9}
        ),
        device="cpu",
        **kw,
    )


def own_kinds(report: dict) -> dict:
    """Problems found by validation itself (rows of the extraction's table left out)."""
    return {k: v for k, v in report["error_counts"].items() if not k.startswith("extract:")}


def edit(store: Path, name: str, index, value) -> None:
    arr = zarr.open_group(str(store), mode="r+")[name]
    arr[index] = value


def offsets(store: Path) -> np.ndarray:
    return np.asarray(zarr.open_group(str(store), mode="r")["offsets"][:])


def assert_in_summary(report: dict, kind: str, tmp_path: Path) -> None:
    """The kind shows in the summary table, and the summary fails on it."""
    import pandas as pd

    path = tmp_path / "report.json"
    write_json(path, report, default=str)
    extract_errors = sum(v for k, v in report["error_counts"].items() if k.startswith("extract:"))
    ok, msg = summarize([path], tmp_path / "s.csv", tmp_path / "s.md", max_errors=extract_errors)
    assert not ok and kind in msg
    table = pd.read_csv(tmp_path / "s.csv")
    assert table.iloc[-1][f"err:{kind}"] == report["error_counts"][kind] >= 1
    assert f"`{kind}`" in (tmp_path / "s.md").read_text()


def test_clean_shards_pass(clean):
    root = clean[0]
    for shard in (0, 1):
        store, errors = root / f"shard-{shard:03d}.zarr", root / f"shard-{shard:03d}.errors.csv"
        r = check(clean, store, errors, shard=shard, spot_check_samples=100)
        assert own_kinds(r) == {}, r["problems"]
        listed = sum(1 for _ in csv.DictReader(open(errors)))
        assert r["errors"] == listed and r["samples"] + listed == len(range(shard, N, 2))
        assert r["tokens"] == r["expected_tokens"] > 0
        assert r["samples"] == r["expected_samples"]
        assert r["min_cosine"] > 0.999 and r["greedy_match"] >= 0.9
        assert set(r["cosine"]) == {"aux_1", "aux_3", "aux_4", "final"}
        assert r["greedy_tokens"] == r["tokens"]  # every sample was spot-checked
        assert r["compression_ratio"] > 1.0 and r["bytes_per_token"] > 0


def test_corrupted_chunk(clean, tmp_path):
    store, errors = copy_shard(clean, tmp_path)
    chunk = store / "aux_hidden" / "c" / "0" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[100:108] = bytes(b ^ 0xFF for b in data[100:108])
    chunk.write_bytes(data)
    r = check(clean, store, errors, spot_check_samples=0)
    assert own_kinds(r).get("checksum", 0) >= 1
    assert all(p["sample_id"] for p in r["problems"] if p["kind"] == "checksum")
    assert_in_summary(r, "checksum", tmp_path)


def test_missing_sample(clean, tmp_path):
    src, errors = copy_shard(clean, tmp_path / "src")
    reader = ShardReader(src)
    dst = tmp_path / "shard-000.zarr"
    writer = ShardWriter(
        dst,
        hidden_size=reader.hidden_size,
        aux_layer_ids=reader.aux_layer_ids,
        provenance=reader.attrs["provenance"],
        chunk_tokens=32,
        shard_tokens=256,
    )
    dropped = reader.sample_ids[2]
    for i in range(len(reader)):
        s = reader[i]
        if s["sample_id"] != dropped:
            writer.append(
                s["sample_id"], s["input_ids"], s["loss_mask"], s["aux_hidden"], s["final_hidden"]
            )
    writer.finish()
    writer.close()
    r = check(clean, dst, errors)
    assert own_kinds(r) == {"missing": 1}
    assert [p["sample_id"] for p in r["problems"] if p["kind"] == "missing"] == [dropped]
    assert_in_summary(r, "missing", tmp_path)


def test_missing_errors_row(clean, tmp_path):
    store, errors = copy_shard(clean, tmp_path)
    rows = list(csv.DictReader(open(errors)))
    assert rows, "the fixture must have extraction errors"
    with open(errors, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows[1:])
    r = check(clean, store, errors, spot_check_samples=0)
    assert own_kinds(r) == {"missing": 1}


def test_duplicated_sample(clean, tmp_path):
    store, errors = copy_shard(clean, tmp_path)
    ids = zarr.open_group(str(store), mode="r")["sample_id"][:]
    edit(store, "sample_id", 3, str(ids[1]))
    r = check(clean, store, errors, spot_check_samples=0)
    kinds = own_kinds(r)
    assert kinds["duplicate"] == 1 and kinds["missing"] == 1
    assert_in_summary(r, "duplicate", tmp_path)


def test_non_finite_value(clean, tmp_path):
    store, errors = copy_shard(clean, tmp_path)
    edit(store, "aux_hidden", (int(offsets(store)[2]) + 1, 1, 5), NAN)
    r = check(clean, store, errors, spot_check_samples=0)
    assert own_kinds(r) == {"non_finite": 1}
    assert_in_summary(r, "non_finite", tmp_path)


def test_zero_row(clean, tmp_path):
    store, errors = copy_shard(clean, tmp_path)
    edit(store, "final_hidden", int(offsets(store)[1]), np.zeros(32, dtype=np.uint16) + ZERO)
    r = check(clean, store, errors, spot_check_samples=0)
    assert own_kinds(r) == {"zero_rows": 1}
    assert_in_summary(r, "zero_rows", tmp_path)


def test_offset_error(clean, tmp_path):
    store, errors = copy_shard(clean, tmp_path)
    off = offsets(store)
    edit(store, "offsets", 3, int(off[2]))
    r = check(clean, store, errors, spot_check_samples=0)
    assert own_kinds(r).get("offsets", 0) >= 1
    assert_in_summary(r, "offsets", tmp_path)


def test_wrong_input_ids(clean, tmp_path):
    store, errors = copy_shard(clean, tmp_path)
    at = int(offsets(store)[2]) + 3
    old = int(zarr.open_group(str(store), mode="r")["input_ids"][at])
    edit(store, "input_ids", at, old + 1)
    r = check(clean, store, errors, spot_check_samples=0)
    assert own_kinds(r) == {"input_ids": 1}
    assert_in_summary(r, "input_ids", tmp_path)


def test_wrong_final_state_fails_cosine_and_greedy(clean, tmp_path):
    store, errors = copy_shard(clean, tmp_path)
    group = zarr.open_group(str(store), mode="r+")
    group["final_hidden"][:] = group["aux_hidden"][:, 2, :]  # a layer output, not the final norm
    r = check(clean, store, errors, spot_check_samples=100)
    assert r["cosine"]["final"] < 0.999 and r["cosine"]["aux_4"] > 0.999
    assert own_kinds(r)["cosine"] == 1 and own_kinds(r)["greedy"] == 1
    assert_in_summary(r, "greedy", tmp_path)


def test_incomplete_store_and_wrong_layers(clean, tmp_path):
    store, errors = copy_shard(clean, tmp_path)
    zarr.open_group(str(store), mode="r+").attrs["complete"] = False
    r = check(clean, store, errors, spot_check_samples=0, aux_layer_ids=[1, 2, 4])
    assert own_kinds(r) == {"incomplete": 1, "aux_layer_ids": 1}
    assert_in_summary(r, "incomplete", tmp_path)


def test_unreadable_store(clean, tmp_path):
    store, errors = copy_shard(clean, tmp_path)
    (store / "zarr.json").unlink()
    r = check(clean, store, errors)
    assert "unreadable" in own_kinds(r)
    assert_in_summary(r, "unreadable", tmp_path)


def test_summary_counts_every_kind_and_fails(clean, tmp_path):
    root = clean[0]
    reports = []
    r0 = check(clean, root / "shard-000.zarr", root / "shard-000.errors.csv")
    r1 = check(clean, root / "shard-001.zarr", root / "shard-001.errors.csv", shard=1)
    for r in (r0, r1):
        path = tmp_path / f"{r['shard']}.json"
        write_json(path, r, default=str)
        reports.append(path)
    extract_errors = r0["errors"] + r1["errors"]
    ok, msg = summarize(reports, tmp_path / "s.csv", tmp_path / "s.md", max_errors=extract_errors)
    assert ok, msg
    ok, msg = summarize(reports, tmp_path / "s.csv", tmp_path / "s.md", max_errors=0)
    assert not ok and "max_errors" in msg

    # a damaged copy of shard 0, plus a shard 1 that also stores one of shard 0's samples
    bad, errors = copy_shard(clean, tmp_path / "bad")
    group = zarr.open_group(str(bad), mode="r+")
    edit(bad, "aux_hidden", (int(offsets(bad)[1]), 0, 0), NAN)
    edit(bad, "input_ids", int(offsets(bad)[3]), int(group["input_ids"][int(offsets(bad)[3])]) + 1)
    chunk = bad / "final_hidden" / "c" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[64:72] = bytes(b ^ 0xFF for b in data[64:72])
    chunk.write_bytes(data)
    foreign = ShardReader(root / "shard-000.zarr")[0]
    src1 = ShardReader(root / "shard-001.zarr")
    w = ShardWriter(
        tmp_path / "s1" / "shard-001.zarr",
        hidden_size=src1.hidden_size,
        aux_layer_ids=src1.aux_layer_ids,
        provenance=src1.attrs["provenance"],
        chunk_tokens=32,
        shard_tokens=256,
    )
    for s in [src1[i] for i in range(len(src1))] + [foreign]:
        w.append(s["sample_id"], s["input_ids"], s["loss_mask"], s["aux_hidden"], s["final_hidden"])
    w.finish()
    w.close()
    rb = check(clean, bad, errors, spot_check_samples=0)
    r1b = check(
        clean,
        tmp_path / "s1" / "shard-001.zarr",
        root / "shard-001.errors.csv",
        shard=1,
        spot_check_samples=0,
    )
    paths = []
    for r in (rb, r1b):
        path = tmp_path / "bad" / f"{r['shard']}.json"
        write_json(path, r, default=str)
        paths.append(path)
    ok, msg = summarize(paths, tmp_path / "b.csv", tmp_path / "b.md", max_errors=extract_errors)
    assert not ok
    import pandas as pd

    table = pd.read_csv(tmp_path / "b.csv")
    total = table[table["split"] == "all"].iloc[0]
    for kind in ("non_finite", "input_ids", "checksum", "unexpected", "cross_shard"):
        assert total[f"err:{kind}"] >= 1, kind
    assert any(c.startswith("err:extract:") for c in table.columns)
    md = (tmp_path / "b.md").read_text()
    assert "cross_shard" in md and "| all | all |" in md
    assert json.loads(paths[0].read_text())["error_counts"]["non_finite"] == 1


def layout(clean, root: Path) -> Path:
    """A results folder of the clean extraction, and a config naming it; returns the config."""
    src, target, data = clean
    for d in ("store/train", "data"):
        (root / "results" / d).mkdir(parents=True)
    for shard in (0, 1):
        name = f"shard-{shard:03d}"
        shutil.copytree(src / f"{name}.zarr", root / "results" / "store" / "train" / f"{name}.zarr")
        shutil.copy(src / f"{name}.errors.csv", root / "results" / "store" / "train")
    shutil.copy(data, root / "results" / "data" / "train.jsonl")
    cfg = root / "config.yaml"
    cfg.write_text(
        json.dumps(
            {
                "results": str(root / "results"),
                "target": {"path": str(target)},
                "dataset": {"train": str(data), "heldout": str(data), "max_tokens": MAX_TOKENS},
                "capture": {"device": "cpu"},
                "extract": {"shards": 2},
                "validate": {"spot_check_samples": 0, "max_errors": 0},
            }
        )
    )
    return cfg


def flip_chunk(store: Path) -> None:
    chunk = store / "aux_hidden" / "c" / "0" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[100:108] = bytes(b ^ 0xFF for b in data[100:108])
    chunk.write_bytes(data)


def test_one_shard_past_max_errors_fails_naming_the_array_and_the_fix(clean, tmp_path, capsys):
    from eyrie.cli.main import main

    cfg = layout(clean, tmp_path)
    store = tmp_path / "results" / "store" / "train" / "shard-000.zarr"
    listed = sum(1 for _ in csv.DictReader(open(store.with_name("shard-000.errors.csv"))))
    cfg_obj = json.loads(cfg.read_text())
    cfg_obj["validate"]["max_errors"] = listed  # the clean shard is within the limit
    cfg.write_text(json.dumps(cfg_obj))
    assert main(["validate", "--config", str(cfg), "--split", "train", "--shard", "0"]) == 0
    flip_chunk(store)
    capsys.readouterr()
    assert main(["validate", "--config", str(cfg), "--split", "train", "--shard", "0"]) == 1
    err = capsys.readouterr().err
    assert "train/000" in err and f"more than validate.max_errors ({listed})" in err
    assert f"rm -rf {store} {store.with_name('shard-000.errors.csv')}" in err
    assert f"`snakemake --cores 1 --configfile {cfg} -- {store}`" in err
    assert f"eyrie extract --config {cfg} --split train --shard 0" in err
    out = tmp_path / "results" / "validate" / "train" / "shard-000.json"
    report = json.loads(out.read_text())
    details = [p["detail"] for p in report["problems"] if p["kind"] == "checksum"]
    assert details and all(
        d.startswith("aux_hidden: stored and computed checksum do not match") for d in details
    ), details


def test_summary_past_max_errors_says_to_delete_and_reextract(clean, tmp_path):
    store, errors = copy_shard(clean, tmp_path)
    flip_chunk(store)
    r = check(clean, store, errors, spot_check_samples=0)
    path = tmp_path / "report.json"
    write_json(path, r, default=str)
    ok, msg = summarize([path], tmp_path / "s.csv", tmp_path / "s.md", max_errors=0)
    assert not ok
    assert f"delete it and extract the shard again: `rm -rf {store} {errors}`" in msg
    assert "eyrie extract --config config.yaml --split train --shard 0" in msg


def test_half_deleted_store_is_named_as_such_with_the_fix(clean, tmp_path):
    store, errors = copy_shard(clean, tmp_path)
    shutil.rmtree(store / "sample_id")
    (store / "commit.json").unlink()
    r = check(clean, store, errors, spot_check_samples=0)
    (detail,) = [p["detail"] for p in r["problems"] if p["kind"] == "unreadable"]
    assert "half deleted" in detail and "commit.json, sample_id/zarr.json missing" in detail
    assert "--forcerun extract" in detail
    path = tmp_path / "report.json"
    write_json(path, r, default=str)
    ok, msg = summarize([path], tmp_path / "s.csv", tmp_path / "s.md", max_errors=0)
    assert not ok and f"rm -rf {store}" in msg
