"""The wrapper chain live: the python parts of scripts/gpu_e2e_kimi.sh (tests/e2e/kimi_e2e.py).

On a GPU with sglang: toy-kimi-k25 through the workflow's extract rule (capture.backend: sglang),
validate with zero errors, parity with an independent transformers forward of the wrapper's
language-model tensors, and both negative controls. CI rehearses the same steps on the CPU
against the stand-in server through the script itself (.ci/run: scripts/gpu_e2e_kimi.sh
--standin); pytest does it too with EYRIE_FULL_TESTS=1 (about two minutes). The first negative
control (verify on SGLang source whose wrapper no longer delegates) runs here always: it needs
only SGLang 0.5.12's source from the verify cache.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from e2e.harness import StepError, why_no_gpu_run
from e2e.kimi_controls import no_delegation, remove_delegation
from e2e.kimi_e2e import KimiRun, main
from test_gpu_sglang import failed_compare

REPO = Path(__file__).resolve().parent.parent


def _release(version: str):
    from eyrie.verify.source import VerifyError, locate

    try:
        return locate(f"pip:{version}")
    except VerifyError as exc:
        pytest.skip(f"sglang {version} cannot be fetched here: {exc}")


def _run(tmp_path, *extra) -> dict:
    rc = main(["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), *extra])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert rc == 0, summary.get("error")
    assert summary["ok"]
    assert len(list((tmp_path / "out").iterdir())) <= 8
    return summary


def _check(summary: dict, min_samples: int) -> None:
    w, c, neg = summary["workflow"], summary["compare"], summary["negative"]
    assert summary["target"]["architecture"] == "KimiK25ForConditionalGeneration"
    assert w["validate_errors"] == 0 and w["mechanism"] == "forward_hooks"
    assert w["samples"] >= min_samples and w["samples_longer_than_chunk"] > 0
    assert c["input_ids_identical"] and c["samples"] == w["samples"]
    assert all(layer["mean"] >= 0.999 for layer in c["layers"].values()), c["layers"]
    assert neg["no_delegation"]["verdict"] == "patchable"
    assert neg["no_delegation"]["installed_check"].startswith("refused")
    assert "captured nothing" in neg["wrong_hook_path"]["error"]
    assert any("No modules matched" in ln for ln in neg["wrong_hook_path"]["server_log"])


@pytest.mark.gpu
@pytest.mark.skipif(why_no_gpu_run() is not None, reason=str(why_no_gpu_run()))
def test_kimi_wrapper_end_to_end_on_a_gpu(tmp_path):
    _check(_run(tmp_path), min_samples=60)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("EYRIE_FULL_TESTS") != "1", reason="set EYRIE_FULL_TESTS=1")
def test_the_same_steps_rehearsed_on_the_cpu(tmp_path):
    summary = _run(tmp_path, "--standin", "--budget-s", "600")
    _check(summary, min_samples=20)
    assert all(layer["min"] > 0.9999 for layer in summary["compare"]["layers"].values())


def test_verify_catches_a_wrapper_that_no_longer_delegates(tmp_path):
    """Control (a) without a server: the real 0.5.12 source, its delegation line removed."""
    from eyrie.sglang.patch.manifest import build_manifest
    from eyrie.target.toy.kimi import build
    from eyrie.verify.stage import run_stage

    release = _release("0.5.12")
    toy = build(tmp_path / "toy", REPO / "models" / "toy-llama", tiny=True)
    report = run_stage(toy, "sglang", None, sglang=str(release.root))
    assert report["sglang"][0]["targets"][0]["verdict"] == "ok"
    results = tmp_path / "results"
    (results / "patch").mkdir(parents=True)
    path = results / "verify-report.json"
    path.write_text(json.dumps(report, default=str))
    manifest = build_manifest(report, report_path=path, source=release.root)
    (results / "patch" / "manifest.json").write_text(json.dumps(manifest))
    run = SimpleNamespace(
        work=tmp_path / "work",
        config={"target": {"path": str(toy)}, "capture": {"aux_layer_ids": None}},
    )
    out = no_delegation(run, results)
    assert out["removed"] == "sglang/srt/models/kimi_k25.py:810"
    assert out["verdict"] == "patchable" and "only raises" in out["why"]
    assert any(c.startswith("sglang/srt/models/kimi_k25.py:799 ") for c in out["kimi_file_lines"])
    assert "verify.strict is true" in out["strict_failure"]
    assert out["patch"].startswith("capture switched on at model.language_model")
    assert "kimi_k25.py (changed)" in out["installed_check"]
    # the original source is untouched, and a release without the delegation is refused
    assert (
        "self.language_model.set_eagle3_layers_to_capture(layer_ids)"
        in (release.package / "srt" / "models" / "kimi_k25.py").read_text()
    )
    with pytest.raises(StepError, match="found 0"):
        remove_delegation(_release("0.5.9").package, tmp_path / "v9")


def test_a_comparison_that_matches_nothing_is_summarised(tmp_path):
    rc, summary, md = failed_compare(tmp_path, KimiRun)
    assert rc == 1 and md.startswith("# Toy Kimi-K2.5 (wrapper chain)")
    assert "- conv-2: 20 tokens in a, 21 in b, first differing token at position 20" in md
