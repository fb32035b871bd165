"""The SGLang backend on a real GPU: the python parts of scripts/gpu_e2e_sglang.sh.

Runs the workflow's extract rule with capture.backend: sglang on toy-deepseek through the
installed SGLang, validates the store, compares it with the transformers backend's and measures
the patch's throughput cost (tests/e2e/sglang_e2e.py). Skipped where CUDA or sglang is missing.
With EYRIE_FULL_TESTS=1 the same steps are also rehearsed on the CPU against the stand-in server
(about a minute and a half).
"""

from __future__ import annotations

import json
import os

import pytest
from e2e.harness import why_no_gpu_run
from e2e.sglang_e2e import main


def _run(tmp_path, *extra) -> dict:
    rc = main(["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), *extra])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert rc == 0, summary.get("error")
    assert summary["ok"]
    return summary


def _check(summary: dict, min_samples: int) -> None:
    w, c = summary["workflow"], summary["compare"]
    assert w["validate_errors"] == 0
    assert w["samples"] >= min_samples and w["samples_longer_than_chunk"] > 0
    assert c["input_ids_identical"] and c["samples"] == w["samples"]
    assert all(layer["mean"] >= 0.999 for layer in c["layers"].values()), c["layers"]


@pytest.mark.gpu
@pytest.mark.skipif(why_no_gpu_run() is not None, reason=str(why_no_gpu_run()))
def test_sglang_backend_end_to_end_on_a_gpu(tmp_path):
    summary = _run(tmp_path)
    _check(summary, min_samples=200)
    assert summary["workflow"]["mechanism"] == "forward_hooks"  # SGLang 0.5.12
    t = summary["throughput"]
    assert t["plain_tokens_per_s"] > 0 and t["patched_tokens_per_s"] > 0
    print(f"patched/unpatched throughput: {t['ratio']:.3f}")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("EYRIE_FULL_TESTS") != "1", reason="set EYRIE_FULL_TESTS=1")
def test_the_same_steps_rehearsed_on_the_cpu(tmp_path):
    summary = _run(tmp_path, "--standin", "--skip-bench")
    _check(summary, min_samples=20)
    assert all(layer["min"] > 0.9999 for layer in summary["compare"]["layers"].values())
