"""Extraction speaks of the user's dataset: its errors name the user's file and line, and
samples cut at dataset.max_tokens are counted (extraction and validation)."""

from __future__ import annotations

import csv
import json

import pytest
from tiny_target import CORPUS, build_llama, conversation

from eyrie.data.dataset import prepare
from eyrie.extract.shard import extract_shard
from eyrie.validate.settings import validate_settings
from eyrie.validate.shard import validate_shard

MAX_TOKENS = 80  # conversation(1) and (2) fit; "cut" does not
CAPTURE = {"backend": "hf", "aux_layer_ids": None, "device": "cpu", "batch_size": 4}
EXTRACT = {"shards": 1, "chunk_tokens": 32, "shard_tokens": 256}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    target = build_llama(root / "target", layers=8)
    long_prompt = " ".join(CORPUS * 6)  # no assistant token within MAX_TOKENS: too_long
    long_answer = [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": " ".join(CORPUS * 3)},  # cut, but stored
    ]
    lines = [
        "not json",  # user line 1: a problem of the data stage, not in the split file
        "",  # 2: blank
        json.dumps({"id": "a", "messages": conversation(1)}),  # 3
        json.dumps({"id": "long", "messages": [{"role": "user", "content": long_prompt},
                                              {"role": "assistant", "content": "ok"}]}),  # 4
        json.dumps({"id": "b", "messages": conversation(2)}),  # 5
        json.dumps({"id": "cut", "messages": long_answer}),  # 6
    ]  # fmt: skip
    src = root / "user.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    split = root / "data" / "train.jsonl"
    prepare(src, split, root / "data" / "train.problems.csv", split="train")
    out = extract_shard(
        data_path=split,
        target_path=target,
        split="train",
        shard=0,
        out_store=root / "shard-000.zarr",
        errors_csv=root / "shard-000.errors.csv",
        capture=CAPTURE,
        extract=EXTRACT,
        max_tokens=MAX_TOKENS,
        progress=False,
    )
    return root, target, src, split, out


def test_errors_table_names_the_users_file_and_line(run):
    root, _, src, split, _ = run
    rows = [json.loads(x) for x in split.read_text().splitlines()]
    assert [r["source"] for r in rows] == [f"{src}:{n}" for n in (3, 4, 5, 6)]
    with open(root / "shard-000.errors.csv", newline="") as f:
        errors = list(csv.DictReader(f))
    assert [(e["sample_id"], e["reason"], e["source"]) for e in errors] == [
        ("long", "too_long", f"{src}:4")
    ]
    assert errors[0]["line"] == "2"  # the key stays the split file's line (resume)


def test_samples_cut_at_max_tokens_are_counted(run):
    root, target, _, split, out = run
    assert out.samples == 3 and out.truncated == 1 and out.tokens_cut > 0
    report = validate_shard(
        store=root / "shard-000.zarr",
        errors_csv=root / "shard-000.errors.csv",
        data_path=split,
        target_path=target,
        split="train",
        shard=0,
        shards=1,
        max_tokens=MAX_TOKENS,
        settings=validate_settings({"spot_check_samples": 0}),
        device="cpu",
    )
    assert report["truncated"] == 1
    assert report["error_counts"] == {"extract:too_long": 1}
