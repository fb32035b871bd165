"""The server lifecycle, and the SGLang backend end to end against the stand-in server.

The stand-in (tests/e2e/standin.py) serves SGLang's HTTP interface, batches and chunks
prompts the way SGLang's scheduler does, and calls the bundle's hooks with states computed by a
plain transformers forward. So the store the SGLang backend writes through it must equal, bit
for bit, the store the transformers backend writes for the same samples. Everything here runs
on the CPU; what the real SGLang does is proved by tests/test_gpu_sglang.py on a GPU.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from e2e.harness import STANDIN
from e2e.standin import StandIn, serve
from tiny_target import build_llama, write_split

from eyrie.data.errors_table import read_errors
from eyrie.extract.sglang import SglangError
from eyrie.extract.shard import ShardTask, extract_shard
from eyrie.sglang.launch import capture_command, check_server_args
from eyrie.sglang.patch.bundle import build_bundle
from eyrie.sglang.patch.hooks import hook_specs
from eyrie.sglang.patch.manifest import load_manifest
from eyrie.sglang.server import ServerError, SglangServer, free_port
from eyrie.store.compare import compare
from eyrie.verify.source import VerifyError, locate
from eyrie.verify.stage import check_sglang

N = 12
MAX_TOKENS = 80
EXTRACT = {"shards": 1, "chunk_tokens": 32, "shard_tokens": 256}


# ---------------------------------------------------------------------------------------------
# lifecycle


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_failing_server_reports_its_log_and_leaves_nothing(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('boom: no GPU here'); sys.exit(3)"]
    with pytest.raises(ServerError, match="exited with code 3(.|\n)*boom: no GPU here"):
        with SglangServer(cmd, tmp_path / "s.log", 1) as server:
            server.wait_ready(30, poll=0.1)
    assert group_gone(server.proc.pid)


def test_a_server_that_never_gets_ready_is_stopped_with_its_children(tmp_path):
    script = textwrap.dedent(
        """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("scheduler", child.pid, flush=True)
        time.sleep(60)
        """
    )
    with pytest.raises(ServerError, match="not ready after 1 s(.|\n)*scheduler"):
        with SglangServer([sys.executable, "-c", script], tmp_path / "s.log", 1) as server:
            server.wait_ready(1, poll=0.2)
    child = int(re.search(r"^scheduler (\d+)$", (tmp_path / "s.log").read_text(), re.M)[1])
    assert group_gone(server.proc.pid)
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_sigterm_to_the_job_stops_the_server(tmp_path):
    job = textwrap.dedent(
        f"""
        import sys, time
        from eyrie.sglang.server import SglangServer
        cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
        with SglangServer(cmd, {str(tmp_path / "s.log")!r}, 1) as server:
            print(server.proc.pid, flush=True)
            time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", job], stdout=subprocess.PIPE, text=True)
    pgid = int(proc.stdout.readline())
    assert not group_gone(pgid)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while not group_gone(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_gone(pgid)


def test_launch_flags():
    cmd = capture_command("/m", 1234, tp=2, chunked_prefill_size=256, patch_args=["--x"])
    assert cmd[-1] == "--x" and "--attention-backend" in cmd
    assert cmd[cmd.index("--tp") + 1] == "2" and cmd[cmd.index("--port") + 1] == "1234"
    for bad, why in [
        (["--enable-dp-attention"], "scatters"),
        (["--pp-size", "2"], "one pipeline stage"),
        (["--dp=4"], "one pipeline stage"),
        (["--nnodes", "2"], "one node per server"),
        (["--port", "1"], "set by the extract job"),
        (["--speculative-algorithm", "EAGLE3"], "draft and verify"),
    ]:
        with pytest.raises(ServerError, match=why):
            check_server_args(bad)
    check_server_args(["--pp-size", "1", "--mem-fraction-static", "0.8"])


def test_free_port_is_one_sglang_accepts():
    """Below 55535 (SGLang 0.5.12 puts gRPC on port + 10000), with both ports free here."""
    for port in {free_port() for _ in range(300)}:
        assert 1024 < port and port + 10000 <= 65535, port
        for p in (port, port + 10000):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", p))


def test_free_port_skips_a_port_whose_grpc_port_is_taken():
    first = free_port(random.Random(7))
    for taken in (first, first + 10000):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", taken))
            sock.listen()
            assert free_port(random.Random(7)) != first


def ports_from(monkeypatch, *ports: int) -> list[int]:
    """free_port hands out these ports first (as if others took each one after the check)."""
    import eyrie.sglang.server as ss

    real, given, queue = ss.free_port, [], list(ports)

    def next_port(*args, **kw):
        given.append(queue.pop(0) if queue else real(*args, **kw))
        return given[-1]

    monkeypatch.setattr(ss, "free_port", next_port)
    return given


def test_a_launch_that_keeps_clashing_names_its_ports(tmp_path, monkeypatch):
    from eyrie.sglang.server import ready_server

    given = ports_from(monkeypatch, 60001, 60002, 60003)  # SGLang refuses them all
    command = [*STANDIN, "--model-path", str(tmp_path)]
    with pytest.raises(
        ServerError, match=r"port clash on each of 3 launches \(ports 60001, 60002, 60003"
    ) as e:
        with ready_server(lambda port: [*command, "--port", str(port)], tmp_path / "s.log", 60):
            pass
    assert "SGLANG_GRPC_PORT (70003) must be between 1 and 65535" in str(e.value)
    assert given == [60001, 60002, 60003]


# ---------------------------------------------------------------------------------------------
# the backend through the stand-in


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    try:
        release = locate("pip:0.5.12")
    except VerifyError as exc:
        pytest.skip(f"cannot fetch SGLang's source here: {exc}")
    root = tmp_path_factory.mktemp("sglang")
    target = build_llama(root / "target", layers=8)
    data = write_split(root / "data" / "train.jsonl", N)
    check = check_sglang(release, ["LlamaForCausalLM"], num_layers=8, aux_ids=[1, 3, 4])
    (root / "report.json").write_text(json.dumps({"backend": "sglang", "sglang": [check]}))
    manifest = build_bundle(root / "report.json", root / "patch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the stand-in runs: the same float sums
    try:
        run(root, "hf", {"backend": "hf", "device": "cpu", "batch_size": 1}, target, data)
    finally:
        torch.set_num_threads(threads)
    return {"root": root, "target": target, "data": data, "release": release, "manifest": manifest}


def run(root: Path, name: str, capture: dict, target, data, stop_after=None, **kw):
    """Extract into root/name; stop_after=N: stop after N commits (test_extract.stopped)."""
    from test_extract import stopped

    capture = {"aux_layer_ids": None, **capture}
    task = ShardTask(
        data_path=data,
        target_path=target,
        split="train",
        shard=0,
        out_store=root / name / "shard-000.zarr",
        errors_csv=root / name / "shard-000.errors.csv",
        capture=capture,
        extract=EXTRACT,
        max_tokens=MAX_TOKENS,
        commit_every=4,
        progress=False,
        **kw,
    )
    if stop_after is not None:
        return stopped(task, stop_after)
    return extract_shard(**vars(task))


def sglang_capture(world, **sglang) -> dict:
    return {
        "backend": "sglang",
        "device": "cuda",
        "batch_size": 1,
        "sglang": {"bundle": str(world["root"] / "patch"), "launch_timeout_s": 120, **sglang},
    }


def read_store(path: Path) -> dict:
    g = zarr.open_group(str(path), mode="r")
    out = {name: np.asarray(g[name][:]) for name in g.array_keys()}
    attrs = dict(g.attrs)
    attrs["provenance"] = {k: v for k, v in attrs["provenance"].items()}
    out["attrs"] = attrs
    return out


def assert_same_as_hf(world, name: str) -> None:
    a, b = (
        read_store(world["root"] / "hf" / "shard-000.zarr"),
        read_store(world["root"] / name / "shard-000.zarr"),
    )
    assert a.keys() == b.keys()
    for key in a:
        if key == "attrs":
            continue
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
    pa, pb = a["attrs"].pop("provenance"), b["attrs"].pop("provenance")
    assert a["attrs"] == b["attrs"]  # layer ids, convention, dtype, hidden size, complete
    assert (pa["backend"], pb["backend"]) == ("hf", "sglang")
    assert pb["settings"]["sglang"]["mechanism"] == "forward_hooks"
    same = {"weights_sha256", "tokenizer_sha256", "data_sha256", "split", "shard", "shards"}
    assert {k: pa[k] for k in same} == {k: pb[k] for k in same}
    assert set(pa) == set(pb)


def test_launched_server_gives_the_transformers_store(world, monkeypatch):
    # the launch Python finds the verified release, so the pre-launch hash check can run
    monkeypatch.setenv(
        "PYTHONPATH", f"{world['release'].root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    )
    # the first port is taken after the check, the second one SGLang refuses: both retried
    taken = socket.socket()
    taken.bind(("127.0.0.1", free_port()))
    taken.listen()
    given = ports_from(monkeypatch, taken.getsockname()[1], 60000)
    capture = sglang_capture(
        world,
        launcher=STANDIN,
        chunked_prefill_size=16,
        concurrency=4,
        log_dir=str(world["root"] / "logs"),
    )
    out = run(world["root"], "launched", capture, world["target"], world["data"])
    assert out.samples == N and out.errors == {}
    assert_same_as_hf(world, "launched")
    log = (world["root"] / "logs" / "shard-000.sglang.log").read_text()
    assert "--disable-radix-cache" in log and "--forward-hooks" in log
    taken.close()
    assert len(given) == 3 and len(re.findall(r"^\$ ", log, re.M)) == 3, given  # one log
    assert "Address already in use" in log and "SGLANG_GRPC_PORT (70000)" in log
    assert f"--port {given[2]}" in log.split("$ ")[-1]
    report = compare(
        [world["root"] / "launched" / "shard-000.zarr"], [world["root"] / "hf" / "shard-000.zarr"]
    )
    assert report["ok"] and report["input_ids_identical"]
    assert all(v["min"] > 1 - 1e-6 for v in report["layers"].values())


def test_a_different_installed_release_is_refused_before_launch(world, tmp_path, monkeypatch):
    other = locate("pip:0.5.9")
    monkeypatch.setenv("PYTHONPATH", str(other.root))
    capture = sglang_capture(world, launcher=STANDIN, log_dir=str(tmp_path))
    with pytest.raises(SglangError, match="not the one verified.*0.5.12"):
        run(tmp_path, "x", capture, world["target"], world["data"])
    assert not (tmp_path / "shard-000.sglang.log").exists()  # no server was started


@contextmanager
def external(world, monkeypatch, dump_dir: Path, *, hooks=True, **kw):
    """An in-process stand-in started 'by hand' with the bundle, as launch.sh would."""
    monkeypatch.syspath_prepend(str(world["root"] / "patch" / "python"))
    monkeypatch.syspath_prepend(str(world["release"].root))
    manifest = load_manifest(world["root"] / "patch")
    specs = hook_specs(
        manifest, str(world["root"] / "patch" / "manifest.json"), str(dump_dir), "eyrie-"
    )
    standin = StandIn(world["target"], specs if hooks else [], chunked_prefill_size=16, **kw)
    server = serve(standin, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the stand-in's own process runs; many threads thrash 2 cores
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        torch.set_num_threads(threads)
        server.shutdown()
        standin.stop()


def test_external_server_and_resume_after_a_kill(world, tmp_path, monkeypatch):
    dump = tmp_path / "dump"
    with external(world, monkeypatch, dump) as url:
        capture = sglang_capture(world, url=url, dump_dir=str(dump), concurrency=3)
        run(tmp_path, "ext", capture, world["target"], world["data"], stop_after=1)
        work = tmp_path / "ext" / ".work" / "shard-000.zarr"
        assert json.loads((work / "commit.json").read_text())["num_samples"] == 4
        run(tmp_path, "ext", capture, world["target"], world["data"])
    world_ext = {**world, "root": tmp_path}
    (tmp_path / "hf").symlink_to(world["root"] / "hf")
    assert_same_as_hf(world_ext, "ext")
    assert sorted(p.name for p in dump.iterdir() if not p.name.startswith("status-")) == []


def test_external_server_without_the_patch_is_named(world, tmp_path, monkeypatch):
    dump = tmp_path / "dump"
    dump.mkdir(mode=0o700)
    with external(world, monkeypatch, dump, hooks=False) as url:
        capture = sglang_capture(world, url=url, dump_dir=str(dump))
        with pytest.raises(SglangError, match="patch .* is not loaded in it.*launch.sh"):
            run(tmp_path, "x", capture, world["target"], world["data"])
    with pytest.raises(SglangError, match="dump_dir is not"):
        run(
            tmp_path,
            "x",
            sglang_capture(world, url="http://127.0.0.1:9"),
            world["target"],
            world["data"],
        )


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("radix", "radix_prefix_hit.*--disable-radix-cache"),
        ("nohooks", "hooks captured nothing.*No modules matched"),
    ],
)
def test_server_faults_stop_the_job_clearly(world, tmp_path, monkeypatch, fault, message):
    dump = tmp_path / "dump"
    with external(world, monkeypatch, dump, fault=fault) as url:
        capture = sglang_capture(world, url=url, dump_dir=str(dump), dump_timeout_s=0.5)
        with pytest.raises(SglangError, match=message):
            run(tmp_path, "x", capture, world["target"], world["data"])


def test_samples_the_server_refuses_go_to_the_errors_table(world, tmp_path, monkeypatch):
    dump = tmp_path / "dump"
    with external(world, monkeypatch, dump, context_length=60) as url:
        capture = sglang_capture(world, url=url, dump_dir=str(dump))
        out = run(tmp_path, "x", capture, world["target"], world["data"])
    errors = read_errors(tmp_path / "x" / "shard-000.errors.csv")
    assert out.errors == {"server_rejected": len(errors)} and 0 < len(errors) < N
    assert all("context length" in detail for _, reason, detail in errors.values())
    assert out.samples == N - len(errors)


def test_compare_stores_fails_on_other_states(world, tmp_path):
    other = build_llama(tmp_path / "other", layers=8, seed=1)  # same tokenizer, other weights
    run(
        tmp_path, "other", {"backend": "hf", "device": "cpu", "batch_size": 2}, other, world["data"]
    )
    report = compare(
        [world["root"] / "hf" / "shard-000.zarr"], [tmp_path / "other" / "shard-000.zarr"]
    )
    assert report["input_ids_identical"] and not report["ok"]
    assert all(v["mean"] < 0.9 for v in report["layers"].values())
