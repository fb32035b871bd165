"""Kill training mid-run (SIGKILL, at whatever instruction it is on), resume it, and compare
with a run that was never interrupted.

Tolerance: the metrics and the final weights must agree to 1e-6 (relative). On one machine
with one thread count the CPU kernels are deterministic, so the runs are in fact bit-identical;
the margin only absorbs the 6 significant digits the metrics CSV is written with.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from test_train import read_metrics
from test_train_setup import make_setup, tiny_settings

REPO = Path(__file__).resolve().parents[1]
STEPS = 40


def write_config(tmp: Path, s: dict, settings: dict) -> Path:
    cfg = {
        "results": str(tmp / "results"),
        "target": {"path": str(s["target"])},
        "dataset": {"train": "unused.jsonl", "heldout": "unused.jsonl"},
        "train": settings,
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def command(cfg: Path, s: dict, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "eyrie.cli.main",
        "train",
        "--config",
        str(cfg),
        "--train-stores",
        *map(str, s["train"]),
        "--heldout-stores",
        *map(str, s["heldout"]),
        "--vocab",
        str(s["vocab"]),
        "--out",
        str(out),
        "--no-progress",
        "--threads",
        "1",
    ]


def environment() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return env


def compare(a: Path, b: Path) -> None:
    ra, rb = read_metrics(a / "metrics.csv"), read_metrics(b / "metrics.csv")
    assert (
        [r["step"] for r in ra] == [r["step"] for r in rb] == [str(i) for i in range(1, STEPS + 1)]
    )
    for x, y in zip(ra, rb, strict=True):
        for col in x:
            if col != "elapsed_s":
                assert float(x[col]) == pytest.approx(float(y[col]), rel=1e-6, abs=1e-9), col
    wa = load_file(str(a / "drafter" / "model.safetensors"))
    wb = load_file(str(b / "drafter" / "model.safetensors"))
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=1e-6, atol=1e-9)


def test_resume_after_kill_equals_uninterrupted(tmp_path):
    s = make_setup(tmp_path, n_train=32, n_heldout=4)
    settings = tiny_settings(max_steps=STEPS, checkpoint_every=7, batch_size=4)
    cfg = write_config(tmp_path, s, settings)
    env = environment()

    whole = tmp_path / "whole"
    subprocess.run(command(cfg, s, whole), env=env, check=True, capture_output=True, cwd=REPO)

    broken = tmp_path / "broken"
    live = broken / "work" / "metrics.csv"
    proc = subprocess.Popen(
        command(cfg, s, broken),
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    try:
        while time.time() < deadline and proc.poll() is None:
            if live.is_file() and len(live.read_text().splitlines()) > 17:  # past 2 checkpoints
                break
            time.sleep(0.01)
        assert proc.poll() is None, "training finished before it could be killed; raise STEPS"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert not (broken / "metrics.csv").exists()
    killed_at = len(live.read_text().splitlines()) - 1
    assert killed_at < STEPS

    done = subprocess.run(
        command(cfg, s, broken), env=env, capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert "from step 0 " not in done.stderr  # it resumed from a checkpoint
    compare(whole, broken)
