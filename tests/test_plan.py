"""`eyrie plan`'s bill checked against a real small run: the bytes of an extracted store's
arrays, and the jobs of Snakemake's own DAG for the same config."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
import zarr
from tiny_target import build_llama, write_split

from eyrie.common.config import WORKFLOW_CONFIG, check, load
from eyrie.extract.shard import extract_shard
from eyrie.plan.bill import PlanError, load_rates, make_bill, render

ROOT = Path(__file__).resolve().parents[1]


def test_raw_bytes_are_those_of_a_real_store(tmp_path):
    target = build_llama(tmp_path / "target", layers=8)
    data = write_split(tmp_path / "train.jsonl", 6)
    store = tmp_path / "shard-000.zarr"
    extract_shard(data_path=data, target_path=target, split="train", shard=0, out_store=store,
                  errors_csv=tmp_path / "errors.csv", max_tokens=64, progress=False,
                  capture={"backend": "hf", "aux_layer_ids": None, "device": "cpu",
                           "batch_size": 3},
                  extract={"shards": 1, "chunk_tokens": 32, "shard_tokens": 256})  # fmt: skip
    group = zarr.open_group(str(store), mode="r")
    arrays = [group["aux_hidden"], group["final_hidden"]]
    real = sum(int(np.prod(a.shape)) * 2 for a in arrays)  # bf16: 2 bytes a value
    tokens, hidden = group["final_hidden"].shape
    bill = make_bill(load(WORKFLOW_CONFIG), hidden=hidden, tokens=tokens)
    assert bill.raw_bytes == real and bill.states == group["aux_hidden"].shape[1] + 1
    assert bill.stored_bytes == pytest.approx(real * load_rates()["stored_over_raw"]["lossless"]
                                              ["value"])  # fmt: skip


def dag_counts(overlay: Path) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--quiet", "rules", "--configfile", str(overlay)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", out, re.M)}


@pytest.mark.parametrize("shards, regenerate", [(3, True), (1, False)])
def test_jobs_are_those_of_snakemakes_dag(tmp_path, shards, regenerate):
    overlay = tmp_path / "run.yaml"
    overlay.write_text(yaml.safe_dump({"results": str(tmp_path / "results"),
                                       "extract": {"shards": shards},
                                       "regenerate": {"enabled": regenerate}}))  # fmt: skip
    bill = make_bill(load(overlay, base=WORKFLOW_CONFIG), hidden=128, tokens=1000)
    dag = dag_counts(overlay)
    assert bill.jobs == {name: dag[name] for name in bill.jobs}
    assert ("regenerate" in bill.jobs) is regenerate and bill.jobs["extract"] == 2 * shards


def test_gpu_hours_only_from_a_rate_at_this_width_or_a_given_one():
    config = check({**yaml.safe_load(WORKFLOW_CONFIG.read_text()), "train": {"epochs": 3}})
    width = load_rates()["tokens_per_s"]["train"]["width"]
    at_width = make_bill(config, hidden=width, tokens=7_200_000)
    rate = load_rates()["tokens_per_s"]["train"]["value"]
    assert at_width.gpu_hours["train"] == pytest.approx(7_200_000 * 3 / rate / 3600)
    other = make_bill(config, hidden=7168, tokens=7_200_000)
    assert "train" not in other.gpu_hours and "not measured" in render(other)
    given = make_bill(config, hidden=7168, tokens=7_200_000, train_tok_s=4000)
    assert given.gpu_hours["train"] == pytest.approx(1.5)  # 7.2 M × 3 epochs at 4,000 tok/s


def test_a_precision_without_a_measured_size_is_refused():
    config = check({**yaml.safe_load(WORKFLOW_CONFIG.read_text()),
                    "extract": {"precision": "bitround-3"}})  # fmt: skip
    with pytest.raises(PlanError, match="bitround-3"):
        make_bill(config, hidden=7168, tokens=1)


def test_the_seed_jobs_bill_from_the_command_line():
    out = subprocess.run([sys.executable, "-m", "eyrie.cli.main", "plan", "--tokens", "17.3e6",
                          "--hidden", "7168"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    assert "17,300,000 tokens at hidden 7168" in out
    assert "992.1 GB" in out  # 17.3 M × 4 states × 7168 × 2 bytes
