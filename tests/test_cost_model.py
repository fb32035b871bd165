"""The speculation cost model against numpy's fit, and the SGLang grid against a fake server."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fake_sglang import fake_server

from eyrie.evaluate import cost_model as cm

ROOT = Path(__file__).resolve().parents[1]


def test_chain_fit_matches_numpy_polyfit():
    ks = [1, 2, 3, 4, 5, 6]
    rng = np.random.default_rng(0)
    ms = [3.1 + 0.42 * k + e for k, e in zip(ks, rng.normal(0, 0.05, len(ks)), strict=True)]
    fit = cm.fit_chain(ks, ms)
    slope, intercept = np.polyfit(ks, ms, 1)
    assert fit.per_draft_ms == pytest.approx(slope, rel=1e-9)
    assert fit.fixed_ms == pytest.approx(intercept, rel=1e-9)
    assert fit.cycle_ms(3) == pytest.approx(np.polyval([slope, intercept], 3))


def test_chain_fit_needs_two_draft_counts():
    with pytest.raises(ValueError, match="two or more distinct"):
        cm.fit_chain([3, 3], [4.0, 4.1])


def test_speedup_is_tokens_per_cycle_over_tokens_per_plain_step():
    # 2.9 tokens per 13 ms cycle against one token per 6.5 ms: 2.9 / 2 = 1.45x
    assert cm.speedup(2.9, 6.5, 13.0) == pytest.approx(1.45)
    assert cm.break_even(6.5, 13.0) == pytest.approx(2.0)
    assert cm.speedup(cm.break_even(6.5, 13.0), 6.5, 13.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="accept length"):
        cm.speedup(0.5, 6.5, 13.0)
    check = cm.check_published(2.9, 1.45, 6.5, 13.0)
    assert check["relative_error"] == pytest.approx(0.0, abs=1e-12)


FAKE = fake_server(
    setup="""
STEP = 0.004                      # a plain step
CYCLE = 0.006 + 0.001 * a.speculative_num_steps
ACCEPT = 2.0                      # tokens per verify pass
""",
    post="""
n = req["sampling_params"]["max_new_tokens"]
out = [(sum(req["input_ids"]) + i) % 97 for i in range(n)]
time.sleep(0.002)  # the prefill: the first token
meta = {}
if a.speculative_algorithm and n > 1:
    passes = round((n - 1) / ACCEPT)
    time.sleep(passes * CYCLE)
    meta = {"spec_accept_length": (n - 1) / passes, "spec_verify_ct": passes}
else:
    time.sleep((n - 1) * STEP)
self._send(200, {"output_ids": out, "meta_info": meta})
""",
)


def test_grid_recovers_the_fake_servers_costs(tmp_path):
    """The fake decodes a plain step in 4 ms and a chain cycle of k in 6 + k ms, emitting 2
    tokens a pass: the grid must find those costs, the fit, and the speed-ups they imply."""
    fake = tmp_path / "fake_sglang.py"
    fake.write_text(FAKE)
    out = tmp_path / "grid.json"
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "sglang_grid.py"), "--target", str(tmp_path),
        "--draft", str(tmp_path), "--tokenizer", str(ROOT / "models" / "toy-llama"),
        "--prompts-jsonl", str(ROOT / "data" / "chat" / "heldout.jsonl"), "--prompts", "3",
        "--max-new-tokens", "41", "--grid", "1-1-2", "3-1-4", "--parallel", "3",
        "--launcher", f"{sys.executable} {fake}", "--launch-timeout", "60",
        "--published", "3-1-4:2.0:1.0", "--out", str(out), "--log-dir", str(tmp_path / "logs"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads(out.read_text())["summary"]
    assert s["plain_step_ms"] == pytest.approx(4.0, rel=0.25)
    rows = {r["point"]: r for r in s["grid"]}
    assert rows["1-1-2"]["cycle_ms"] == pytest.approx(7.0, rel=0.25)
    assert rows["3-1-4"]["cycle_ms"] == pytest.approx(9.0, rel=0.25)
    assert rows["3-1-4"]["accept_length"] == pytest.approx(2.0)
    assert rows["3-1-4"]["identical"] == 3
    assert s["chain_fit"]["per_draft_ms"] == pytest.approx(1.0, rel=0.5)
    # 2 tokens per 9 ms against 1 per 4 ms: 0.89x, and the published 1.0x is 11 % above it
    assert s["published_check"]["predicted_speedup"] == pytest.approx(8 / 9, rel=0.2)
    assert "PROJECTED" not in proc.stdout and "3-1-4" in proc.stdout

    # the summary again from the saved points, with another published figure
    again = tmp_path / "again.json"
    cmd2 = [sys.executable, str(ROOT / "benchmarks" / "sglang_grid.py"), "--from-json", str(out),
            "--target", str(tmp_path), "--draft", str(tmp_path), "--published", "1-1-2:2.0:1.0",
            "--accept-from", str(out), "--out", str(again), "--log-dir", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd2, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s2 = json.loads(again.read_text())["summary"]
    assert s2["grid"] == s["grid"]
    assert s2["published_check"]["predicted_speedup"] == pytest.approx(8 / 7, rel=0.2)
    projected = {p["point"]: p for p in s2["projected"]}
    assert projected["3-1-4"]["label"] == "projected"
    assert projected["3-1-4"]["projected_speedup"] == pytest.approx(rows["3-1-4"]["speedup"])


PROFILED = fake_server(
    setup="""
import gzip
PERIOD = 0.006 if a.speculative_algorithm else 0.004
""",
    post="""
if self.path == "/start_profile":  # a trace of num_steps steps: one 1 ms kernel per period
    steps, us = req["num_steps"], PERIOD * 1e6
    events = [{"ph": "X", "cat": "kernel", "name": "gemm", "ts": i * us, "dur": 1000.0}
              for i in range(steps)]
    events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0,
                   "dur": 50.0})
    with gzip.open(f"{req['output_dir']}/x-TP-0.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    self._send(200, {})
    return
n = req["sampling_params"]["max_new_tokens"]
time.sleep(0.001 * n)
meta = {"spec_accept_length": 1.0, "spec_verify_ct": n - 1} if a.speculative_algorithm else {}
self._send(200, {"output_ids": [7] * n, "meta_info": meta})
""",
)


def test_grid_profiles_a_point_and_its_extra_flags_reach_every_server(tmp_path):
    fake = tmp_path / "fake_sglang.py"
    fake.write_text(PROFILED)
    out = tmp_path / "grid.json"
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "sglang_grid.py"), "--shape", "smollm2-135m",
        "--tokenizer", str(ROOT / "models" / "toy-llama"), "--prompts-jsonl",
        str(ROOT / "data" / "chat" / "heldout.jsonl"), "--prompts", "2", "--max-new-tokens", "5",
        "--grid", "3-1-4", "--launcher", f"{sys.executable} {fake}", "--launch-timeout", "60",
        "--extra-flags", "--speculative-attention-mode decode", "--profile", "plain", "3-1-4",
        "--profile-steps", "10", "--out", str(out), "--log-dir", str(tmp_path / "logs"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = json.loads(out.read_text())
    assert rec["server_flags"][-2:] == ["--speculative-attention-mode", "decode"]
    for log in ("sglang-plain.log", "sglang-3-1-4.log"):
        assert "--speculative-attention-mode decode" in (tmp_path / "logs" / log).read_text()
    s = rec["summary"]
    assert s["extra_flags"] == "--speculative-attention-mode decode"
    # 10 steps, a 1 ms kernel each 4 ms (plain) or 6 ms (3-1-4): span (9 periods + 1 ms) / 10
    plain, cycle = s["plain_profile"], s["grid"][0]["profile"]
    assert plain["gpu_busy_ms"] == pytest.approx(1.0) and cycle["gpu_busy_ms"] == pytest.approx(1.0)
    assert plain["span_ms"] == pytest.approx(3.7) and cycle["span_ms"] == pytest.approx(5.5)
    assert cycle["gpu_idle_share"] == pytest.approx(1 - 1 / 5.5)
    assert cycle["top_runtime"][0]["name"] == "cudaGraphLaunch"
    assert "profile 3-1-4: 5.500 ms a step, GPU busy 1.000 ms (82 % idle)" in proc.stdout


def test_the_flags_script_rehearsed_with_a_stand_in_server(tmp_path):
    """benchmarks/gpu_sglang_flags.sh end to end on the CPU: a set per flag string (one of them
    a lone flag, which argparse must not take for an option of its own), its table."""
    fake = tmp_path / "fake_sglang.py"
    fake.write_text(PROFILED)
    env = dict(os.environ, LAUNCHER=f"{sys.executable} {fake}", OUT=str(tmp_path / "out"),
               SETS="base=;v1=--disable-overlap-schedule")  # fmt: skip
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_sglang_flags.sh")], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    v1 = json.loads((tmp_path / "out" / "flags-v1.json").read_text())
    assert v1["server_flags"][-1] == "--disable-overlap-schedule"
    base = json.loads((tmp_path / "out" / "flags-base.json").read_text())["summary"]
    assert base["plain_profile"]["status"] == "ok" and "plain_profile" not in v1["summary"]
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()[-2:]}
    assert set(lines) == {"base", "v1"} and lines["v1"].endswith("--disable-overlap-schedule")
    assert (tmp_path / "out" / "flags-logs.tgz").exists()


def test_tree_and_chain_commands():
    from eyrie.sglang.launch import online_command
    from eyrie.sglang.server import ServerError

    tree = " ".join(online_command("m", 30000, draft_path="d", draft_tokens=4, topk=4,
                                   verify_tokens=8))  # fmt: skip
    assert "--speculative-num-steps 4 --speculative-eagle-topk 4" in tree
    assert "--speculative-num-draft-tokens 8" in tree
    chain = " ".join(online_command("m", 30000, draft_path="d", draft_tokens=3))
    assert "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4" in chain
    with pytest.raises(ServerError, match="verifies 4 tokens"):
        online_command("m", 30000, draft_path="d", draft_tokens=3, verify_tokens=6)
    with pytest.raises(ServerError, match="needs verify_tokens"):
        online_command("m", 30000, draft_path="d", draft_tokens=3, topk=2)
