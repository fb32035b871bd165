"""Partial reruns of the default workflow: a change reruns what depends on it, and nothing else.

One complete local run of tests/configs/small.yaml is the baseline; each test works on a copy
of it (outputs, mtimes and .snakemake metadata preserved). Plans come from `snakemake -n` with
Snakemake 9's default rerun triggers (mtime, params, input, software-env, code); real runs
check the plan was honest: which jobs ran (their blocks in the log), which files changed
(mtimes), and that a run killed midway resumes with --rerun-incomplete losing nothing.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr
from slurm.workflow import CONFIGS, Workflow, parse_plan

pytestmark = pytest.mark.slow

SPLITS, SHARDS = ("train", "heldout"), ("000", "001")


# Scratch space of resumable jobs, no rule's output: train_drafter's checkpoints.
SCRATCH = ("train/work",)


def _files(wf: Workflow) -> dict[str, int]:
    """mtime (ns) of every output, log and benchmark file under results/, by path relative to
    the scratch folder.

    Left out: scratch space, and hidden names, which are caches and scratch too (e.g.
    target/.sha256-cache.json, the target's file digests, and extract's store/*/.work);
    Snakemake's own .snakemake_timestamp counts.
    """
    root = wf.path("results")
    return {
        str(p.relative_to(wf.root)): p.stat().st_mtime_ns
        for p in sorted(root.rglob("*"))
        if p.is_file() and not _scratch(p.relative_to(root))
    }


def _scratch(rel: Path) -> bool:
    hidden = any(part.startswith(".") and part != ".snakemake_timestamp" for part in rel.parts)
    return hidden or any(rel.as_posix().startswith(s + "/") for s in SCRATCH)


def _changed(before: dict[str, int], after: dict[str, int]) -> set[str]:
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


def _rules(jobs) -> Counter:
    return Counter(j.rule for j in jobs)


def _arrays(store: Path) -> dict[str, np.ndarray]:
    """Every array of a Zarr store, read with zarr itself (not Eyrie's reader)."""
    with warnings.catch_warnings():  # files beside the arrays (commit.json) are expected
        warnings.simplefilter("ignore", UserWarning)
        group = zarr.open_group(str(store), mode="r")
        return {name: arr[...] for name, arr in group.arrays()}


@pytest.fixture(scope="module")
def baseline(small_run) -> Workflow:
    """The complete run of tests/configs/small.yaml (tests/conftest.py; shared with
    tests/test_extract_rerun.py, which also works on copies of it)."""
    assert small_run.configfiles == [(CONFIGS / "small.yaml").resolve()]
    return small_run


@pytest.fixture
def copy(baseline, tmp_path) -> Workflow:
    """The baseline's scratch folder copied with its mtimes, so each test starts from it."""
    root = tmp_path / "wd"
    shutil.copytree(baseline.root, root, symlinks=True)
    return Workflow(root=root, configfiles=list(baseline.configfiles))


def test_nothing_to_do_after_a_complete_run(copy):
    assert copy.plan() == []


TRAINING = Counter(
    {
        "train_drafter": 1,
        "export_drafter": 2,  # one per engine
        "evaluate_acceptance": 1,
        "evaluate_speculate": 1,
        "report": 1,
        "all": 1,
    }
)


def test_training_hyperparameter_reruns_only_training_export_evaluation(copy):
    wf = copy.with_config("lr", {"train": {"lr": 0.002}})
    plan = wf.plan()
    assert _rules(plan) == TRAINING
    for job in plan:
        if job.rule == "train_drafter":
            assert job.reason.startswith("Params have changed since last execution"), job
            assert "0.002" in job.reason  # the reason names the value that changed
        elif job.rule != "all":
            assert job.reason.startswith("Input files updated by another job"), job

    before = _files(wf)
    ran = parse_plan(wf.run())
    assert Counter(j.key for j in ran) == Counter(j.key for j in plan)
    changed = _changed(before, _files(wf))
    stray = [p for p in changed if not any(j.wrote(p) for j in ran)]
    assert changed and not stray, f"files changed by no job that ran: {stray}"
    assert {"results/train/drafter/model.safetensors", "results/report/summary.md"} <= changed
    assert wf.plan() == []
    # The retrained drafter records, and was trained with, the new rate (no stale resume).
    meta = json.loads(wf.path("results/train/drafter/drafter.json").read_text())
    assert meta["train"]["settings"]["lr"] == 0.002
    metrics = pd.read_csv(wf.path("results/train/metrics.csv"))
    assert metrics["step"].tolist() == list(range(1, len(metrics) + 1))
    assert metrics["lr"].max() == pytest.approx(0.002)


def test_forced_training_rerun_trains_again_from_step_zero(copy):
    """-R train_drafter retrains: a finished training leaves no checkpoint to reload."""
    before = copy.path("results/train/metrics.csv").read_text()
    copy.run("--forcerun", "train_drafter", "--until", "train_drafter")
    log = copy.path("results/logs/train_drafter.log").read_text()
    assert "training 3 steps from step 0 (fresh start)" in log, log
    assert not list(copy.path("results/train/work").glob("ckpt-*"))  # none left to reload
    after = pd.read_csv(copy.path("results/train/metrics.csv"))
    assert after["step"].tolist() == [1, 2, 3]
    # the same settings, data and code train the same drafter
    before = pd.read_csv(io.StringIO(before)).drop(columns="elapsed_s")
    pd.testing.assert_frame_equal(after.drop(columns="elapsed_s"), before, rtol=1e-3)


def test_validation_threshold_reruns_validation_not_training(copy):
    """Validation gates training but is not its data: a new threshold does not retrain."""
    wf = copy.with_config("stricter", {"validate": {"min_cosine": 0.99}})
    plan = wf.plan()
    assert _rules(plan) == Counter(
        {"validate_shard": 4, "validate_summary": 1, "report": 1, "all": 1}
    )
    for job in plan:
        if job.rule == "validate_shard":
            assert job.reason.startswith("Params have changed since last execution"), job
            assert "0.99" in job.reason
        elif job.rule in ("validate_summary", "report"):
            assert job.reason.startswith("Input files updated by another job"), job
    # --summary explains it per output file: status says why, plan says what happens next.
    table = wf.summary()
    report = table["results/validate/train/shard-000.json"]
    assert (report["status"], report["plan"]) == ("params changed", "update pending"), report
    weights = table["results/train/drafter/model.safetensors"]
    assert (weights["status"], weights["plan"]) == ("ok", "no update"), weights


def test_removing_a_shard_reruns_it_and_what_depends_on_it(copy):
    store = "results/store/train/shard-001.zarr"
    shutil.rmtree(copy.path(store))
    # A missing intermediate alone reruns nothing: stores may be deleted after training.
    assert copy.plan() == []
    # Asking for it again reruns that shard and everything downstream of it, and only that.
    plan = copy.plan("--forcerun", store)
    assert _rules(plan) == TRAINING + Counter(
        {
            "extract": 1,
            "validate_shard": 1,
            "validate_summary": 1,
            "draft_vocab": 1,
            "evaluate_baselines": 1,  # fit on the train stores
        }
    )
    by_rule = {j.rule: j for j in plan}
    assert by_rule["extract"].wildcards == {"split": "train", "shard": "001"}
    assert by_rule["extract"].reason.startswith("Forced execution"), by_rule["extract"]
    assert by_rule["validate_shard"].wildcards == {"split": "train", "shard": "001"}
    for rule in ("validate_shard", "draft_vocab", "train_drafter"):
        assert by_rule[rule].reason.startswith("Input files updated by another job"), rule


def _wait_for(predicate, proc: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_killed_run_resumes_with_rerun_incomplete_and_loses_nothing(copy, baseline):
    """SIGKILL a run (snakemake and its jobs) after one job finished and the next started.

    The run redoes one heldout shard up to the validation summary (the shorter target keeps
    the test short; test_removing_a_shard covers what follows).
    """
    store = "results/store/heldout/shard-001.zarr"
    target = "results/validate/summary.csv"
    shutil.rmtree(copy.path(store))
    untouched = _files(copy)
    log = copy.root / "killed.log"
    proc = copy.start("--cores", "1", "--forcerun", store, "--", target, log=log)

    def started() -> list[str]:
        return re.findall(r"^localrule (\w+):", log.read_text(), re.M)

    _wait_for(lambda: "Finished jobid" in log.read_text(), proc, 300, "a job finished")
    _wait_for(lambda: len(started()) >= 2, proc, 120, "a second job started")
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert started() == ["extract", "validate_shard"], started()
    extracted = _files(copy)

    copy.run("--unlock")
    resumed = copy.plan("--rerun-incomplete", target)
    assert _rules(resumed) == Counter({"validate_shard": 1, "validate_summary": 1}), resumed
    assert resumed[0].wildcards == {"split": "heldout", "shard": "001"}
    copy.run("--rerun-incomplete", target)
    assert copy.plan(target) == []

    final = _files(copy)
    assert (
        set(final)
        == set(_files(baseline))
        == set(untouched) | {p for p in final if p.startswith(store)}
    )
    redone = {p for p in _changed(untouched, final) if not p.startswith(store)}
    assert redone == {
        "results/logs/extract/heldout/shard-001.log",
        "results/benchmarks/extract/heldout/shard-001.tsv",
        "results/store/heldout/shard-001.errors.csv",
        "results/validate/heldout/shard-001.json",
        "results/logs/validate/heldout/shard-001.log",
        "results/benchmarks/validate/heldout/shard-001.tsv",
        "results/validate/summary.csv",
        "results/validate/summary.md",
        "results/logs/validate/summary.log",
        "results/benchmarks/validate/summary.tsv",
    }, sorted(redone)
    # The shard finished before the kill is kept as it was, and equals the baseline's.
    assert all(final[p] == extracted[p] for p in final if p.startswith(store))
    got, want = _arrays(copy.path(store)), _arrays(baseline.path(store))
    assert got.keys() == want.keys() and got
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # Training and the baselines read the heldout stores: they rerun, and only they.
    assert _rules(copy.plan()) == TRAINING + Counter({"evaluate_baselines": 1})
