"""Two DDP processes (torchrun, gloo on CPU) train the same drafter one process trains on the
same global batches.

Tolerance: 1e-5 relative on the per-step metrics and 1e-5 on the final weights. The two runs
sum the same numbers in a different order (each process pads its half of the batch to its own
longest sample, and gradients are averaged across processes), so they differ by float32
rounding; a wrong loss normalization or batch split differs by far more (tested below).
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file
from test_train import read_metrics
from test_train_resume import REPO, command, environment, write_config
from test_train_setup import make_setup, tiny_settings

STEPS = 6


def metrics_and_weights(out):
    rows = read_metrics(out / "metrics.csv")
    return rows, load_file(str(out / "drafter" / "model.safetensors"))


def run_watching_sockets(cmd, env, tmp_path):
    """Run cmd to the end; (the completed process, every (pid, ip, port) it or its children
    listened on while it ran)."""
    import psutil

    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen(cmd, env=env, stdout=fo, stderr=fe, cwd=REPO)
        seen = set()
        while proc.poll() is None:
            try:
                tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(True)]
            except psutil.NoSuchProcess:
                break
            for q in tree:
                try:
                    conns = q.net_connections(kind="inet")
                except psutil.Error:
                    continue
                seen |= {
                    (q.pid, c.laddr.ip, c.laddr.port)
                    for c in conns
                    if c.status == psutil.CONN_LISTEN
                }
            time.sleep(0.1)
    done = subprocess.CompletedProcess(cmd, proc.wait(), out.read_text(), err.read_text())
    return done, sorted(seen)


def test_ddp_two_processes_equal_one(tmp_path):
    s = make_setup(tmp_path, n_train=16, n_heldout=4)
    settings = tiny_settings(max_steps=STEPS, batch_size=6, checkpoint_every=100)
    cfg = write_config(tmp_path, s, settings)
    env = environment()

    one = tmp_path / "one"
    subprocess.run(command(cfg, s, one), env=env, check=True, capture_output=True, cwd=REPO)
    two = tmp_path / "two"
    # Started as rule train_drafter starts it: run_train with train.processes 2 (eyrie.train.launch,
    # train.rdzv_host null), each process running eyrie.train.stage.
    job = {
        "train_stores": [str(p) for p in s["train"]],
        "heldout_stores": [str(p) for p in s["heldout"]],
        "target_dir": str(s["target"]),
        "vocab_path": str(s["vocab"]),
        "out_dir": str(two),
        "settings": settings,
        "progress": False,
        "processes": 2,
        "threads": 2,
    }
    rule = "import json, sys; import eyrie.train.stage as t; t.run_train(**json.loads(sys.argv[1]))"
    cmd = [sys.executable, "-c", rule, json.dumps(job)]
    done, listening = run_watching_sockets(cmd, env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # Every socket the run listened on is on loopback (torchrun --standalone listens on *).
    assert listening, "no listening socket was seen; the watch is broken"
    assert all(ipaddress.ip_address(ip).is_loopback for _, ip, _ in listening), listening

    rows1, w1 = metrics_and_weights(one)
    rows2, w2 = metrics_and_weights(two)
    assert len(rows1) == len(rows2) == STEPS
    for a, b in zip(rows1, rows2, strict=True):
        assert a["tokens"] == b["tokens"]  # the same samples were trained on
        for col in a:
            if col.startswith(("loss", "acc", "grad_norm")):
                assert float(a[col]) == pytest.approx(float(b[col]), rel=1e-5, abs=1e-6), col
    for name in w1:
        torch.testing.assert_close(w1[name], w2[name], rtol=1e-5, atol=1e-5)
    assert "process 1 of 2" in done.stderr  # two processes really shared the batches
    held1 = json.loads((one / "heldout.json").read_text())
    held2 = json.loads((two / "heldout.json").read_text())
    assert held1["samples"] == held2["samples"] == 4
    assert held1["acc"] == pytest.approx(held2["acc"], rel=1e-5, abs=1e-6)
