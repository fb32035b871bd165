"""The SGLang backend on a real GPU: the python parts of scripts/gpu_e2e_sglang.sh.

Runs the workflow's extract rule with capture.backend: sglang on toy-deepseek through the
installed SGLang, validates the store, compares it with the transformers backend's and measures
the patch's throughput cost (tests/e2e/sglang_e2e.py). Skipped where CUDA or sglang is missing.
CI rehearses the same steps on the CPU against the stand-in server through the script itself
(.ci/run: scripts/gpu_e2e_sglang.sh --standin --skip-bench); pytest does it too with
EYRIE_FULL_TESTS=1 (about a minute and a half). The harness's own parts (which conversations the
reference extracts, the summary of a comparison that matched nothing) are tested always.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from e2e.harness import REPO, StepError, extracted_input, finish, why_no_gpu_run
from e2e.sglang_e2e import SglangRun, main
from test_store import make_sample, write_store, writer
from test_store_compare import differing_stores

from eyrie.common.provenance import file_sha256


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


def failed_compare(tmp_path, run_class=SglangRun) -> tuple[int, dict, str]:
    """The harness's compare step on two stores whose ids differ, as a run ends with it: the
    exit code, summary.json and summary.md."""
    results = tmp_path / "results"
    (results / "store" / "train").mkdir(parents=True)
    a, b = differing_stores(tmp_path)
    a.rename(results / "store" / "train" / "shard-000.zarr")
    run = run_class(tmp_path / "out", tmp_path / "work", True, 60.0)
    run.out.mkdir()
    run.config = {"results": str(results)}
    rc = finish(run, lambda: run.step("compare stores", run.compare, b), "compare only")
    summary = json.loads((run.out / "summary.json").read_text())
    return rc, summary, (run.out / "summary.md").read_text()


def test_a_comparison_that_matches_nothing_is_summarised(tmp_path):
    rc, summary, md = failed_compare(tmp_path)
    assert rc == 1 and not summary["ok"]
    assert "the SGLang and transformers stores differ" in summary["error"]
    assert summary["compare"]["input_ids_differences"][0]["first_difference"] == 7
    assert "| final | - | - | - | - |" not in md  # conv-0 and conv-3 were compared
    assert "- conv-1: 20 tokens in a, 20 in b, first differing token at position 7" in md
    assert "- 1 samples only in b: conv-5" in md


def test_layers_without_a_compared_token_render_as_dashes():
    from e2e.harness import versions
    from e2e.sglang_e2e import markdown

    layer = {"mean": None, "min": None, "p01": None, "below": None, "ok": False}
    compare = {
        "hf_device": "cpu float32",
        "samples": 1,
        "tokens": 0,
        "input_ids_identical": False,
        "layers": {"aux 1": layer, "final": layer},
        "only_in_a": [],
        "only_in_b": [],
        "only_in_a_count": 0,
        "only_in_b_count": 0,
        "input_ids_differ_count": 1,
        "input_ids_differences": [
            {"sample_id": "s", "tokens_a": 96, "tokens_b": 80, "first_difference": 41}
        ],
    }
    summary = {"date": "d", "mode": "m", "versions": versions(), "ok": False, "steps": {}}
    md = markdown({**summary, "compare": compare})
    assert "| final | - | - | - | - |" in md
    assert "- s: 96 tokens in a, 80 in b, first differing token at position 41" in md


def test_the_reference_reads_what_the_store_was_extracted_from(tmp_path):
    data = tmp_path / "regen" / "train.jsonl"
    data.parent.mkdir()
    data.write_text('{"messages": []}\n')
    prov = {"data_path": str(data), "data_sha256": file_sha256(data)}
    with writer(tmp_path / "s.zarr", provenance=prov) as w:
        w.append(**make_sample(0))
        w.finish()
    assert extracted_input(tmp_path / "s.zarr") == data
    data.write_text('{"messages": [1]}\n')
    with pytest.raises(StepError, match=f"{data} changed since .*s.zarr was extracted from it"):
        extracted_input(tmp_path / "s.zarr")
    write_store(tmp_path / "r.zarr", [make_sample(0)])  # the test store's provenance: no data
    with pytest.raises(StepError, match="records no data_path"):
        extracted_input(tmp_path / "r.zarr")


def test_a_relative_data_path_is_the_workflows_directorys(tmp_path):
    data = Path("data/chat/train.jsonl")
    prov = {"data_path": str(data), "data_sha256": file_sha256(REPO / data)}
    with writer(tmp_path / "s.zarr", provenance=prov) as w:
        w.append(**make_sample(0))
        w.finish()
    assert extracted_input(tmp_path / "s.zarr") == REPO / data
