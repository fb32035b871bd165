"""The target's identity: new weights under an unchanged config.json rerun what reads the
target; an untouched or merely touched target reruns nothing.

The workflow tests fake a finished run (Workflow.pretend_finished), so plans come in seconds
without running a job.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
from slurm.workflow import CONFIGS, Workflow

TOY = Path(__file__).resolve().parents[1] / "models" / "toy-llama"
IDENTITY = "results/target/identity.json"

# Every rule of the small run that reads the target, and what follows from them: all of it
# but prepare_dataset.
RERUN = Counter(
    {
        "verify_env": 1,
        "extract": 4,
        "validate_shard": 4,
        "validate_summary": 1,
        "draft_vocab": 1,
        "train_drafter": 1,
        "export_drafter": 2,
        "evaluate_acceptance": 1,
        "evaluate_baselines": 1,
        "evaluate_speculate": 1,
        "evaluate_sglang": 1,
        "report": 1,
        "all": 1,
    }
)


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


@pytest.fixture
def folder(tmp_path) -> Path:
    out = tmp_path / "target"
    shutil.copytree(TOY, out)
    return out


def test_identity_follows_content_not_mtime(folder, tmp_path):
    from eyrie.target.identity import update_identity

    out, cache = tmp_path / "identity.json", tmp_path / "cache.json"
    assert update_identity(folder, out, cache)
    first = json.loads(out.read_text())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(first["files"])
    assert "README.md" not in first["files"]  # documentation does not make a new target
    stamp = out.stat().st_mtime_ns

    os.utime(folder / "model.safetensors")  # a touch: same bytes, new mtime
    (folder / "README.md").write_text("notes")
    assert not update_identity(folder, out, cache)
    assert out.stat().st_mtime_ns == stamp

    _flip_last_byte(folder / "model.safetensors")
    assert update_identity(folder, out, cache)
    second = json.loads(out.read_text())
    assert second["sha256"] != first["sha256"]
    assert second["files"]["config.json"] == first["files"]["config.json"]


def test_unchanged_files_are_not_hashed_again(folder, tmp_path, monkeypatch):
    from eyrie.target import identity

    cache = tmp_path / "cache.json"
    hashed: list[str] = []
    real = identity.file_sha256
    monkeypatch.setattr(identity, "file_sha256", lambda p: hashed.append(p.name) or real(p))
    identity.target_identity(folder, cache)
    assert "model.safetensors" in hashed
    hashed.clear()
    identity.target_identity(folder, cache)
    assert hashed == []
    os.utime(folder / "model.safetensors", ns=(1, 1))
    identity.target_identity(folder, cache)
    assert hashed == ["model.safetensors"]
    # one entry per file: the old (size, mtime) of a rewritten file is dropped
    entries = json.loads(cache.read_text())
    assert sum(":" in k and "model.safetensors" in k for k in entries) == 1


def test_stores_weights_digest_comes_from_the_same_cache(folder, tmp_path):
    from eyrie.target.identity import target_identity, weights_sha256

    cache = tmp_path / "cache.json"
    files = target_identity(folder, cache)["files"]
    digest = weights_sha256(folder, cache)
    # the formula the stores have always recorded: sha256 over "name:sha256" lines
    line = f"model.safetensors:{files['model.safetensors']['sha256']}\n"
    assert digest == hashlib.sha256(line.encode()).hexdigest()


@pytest.fixture
def finished(tmp_path) -> Workflow:
    wf = Workflow.scratch(tmp_path / "wd", CONFIGS / "small.yaml")
    wf.pretend_finished()
    assert wf.plan() == []
    return wf


def test_new_weights_rerun_every_rule_that_reads_the_target(finished):
    wf = finished
    _flip_last_byte(wf.path("models/toy-llama/model.safetensors"))  # config.json unchanged
    plan = wf.plan()
    assert Counter(j.rule for j in plan) == RERUN
    verify = next(j for j in plan if j.rule == "verify_env")
    assert verify.reason == f"Updated input files: {IDENTITY}", verify
    # planned again, not forgotten once the identity was rewritten
    assert Counter(j.key for j in wf.plan()) == Counter(j.key for j in plan)


def test_a_touched_target_reruns_nothing(finished):
    wf = finished
    identity = wf.path(IDENTITY)
    stamp = identity.stat().st_mtime_ns if identity.exists() else None
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        os.utime(wf.path(f"models/toy-llama/{name}"))  # new mtime, same bytes
    assert wf.plan() == []
    assert identity.stat().st_mtime_ns == stamp


def test_a_toy_target_gets_its_identity_from_a_rule_after_its_build(tmp_path):
    toy = {"target": {"path": "toy-deepseek", "toy_tiny": True}}
    wf = Workflow.scratch(tmp_path / "wd", CONFIGS / "small.yaml", toy)
    by_rule = {j.rule: j for j in wf.plan()}
    assert {"build_toy_deepseek", "target_identity"} <= set(by_rule)
    assert by_rule["target_identity"].output == IDENTITY
    assert IDENTITY in by_rule["verify_env"].reason  # verify_env waits for it
    assert not wf.path(IDENTITY).exists()  # not written while parsing: the toy is not built

    wf.run("--cores", "1", IDENTITY, timeout=300)
    files = json.loads(wf.path(IDENTITY).read_text())["files"]
    assert {"config.json", "model.safetensors"} <= set(files)
    assert wf.plan(IDENTITY) == []
    assert {j.rule for j in wf.plan("results/verify/report.json")} == {"verify_env"}
