"""Faults of the SGLang server in the middle of an extract job, through the stand-in server.

For each fault the job must stop soon after it (not after the request timeout), with one
message naming the server, the shard and the next step; leave its scratch store at the last
commit (whole groups only); and, rerun against a healthy server, resume to the store an
uninterrupted run writes. The uninterrupted run is the transformers backend's store of the
`world` fixture, which the SGLang backend through the stand-in matches bit for bit
(tests/test_sglang_server.py); of the provenance only the fields that name the backend and
its settings differ (assert_same_as_hf). The stand-in's faults are described in
tests/e2e/standin.py.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import test_sglang_server
import torch
from e2e.harness import STANDIN
from test_sglang_server import N, assert_same_as_hf, run, sglang_capture

from eyrie.data.errors_table import read_errors
from eyrie.extract.sglang import SglangError
from eyrie.sglang.launch import capture_command
from eyrie.sglang.patch.bundle import server_args, server_env
from eyrie.sglang.server import SglangServer, ready_server
from eyrie.store.shard import ShardReader

GROUP = 4  # run() commits every 4 samples
AFTER = 6  # the faults act once 6 samples were answered: one group committed, one in flight
FAULT_AT = re.compile(r"^stand-in: fault \w+ at ([\d.]+)$", re.M)

# the target, data, bundle and the uninterrupted (transformers) store of the SGLang tests
world = test_sglang_server.world


# ---------------------------------------------------------------------------------------------
# helpers


def work_store(root: Path) -> Path:
    return root / ".work" / "shard-000.zarr"


def hf_store(world) -> Path:
    return world["root"] / "hf" / "shard-000.zarr"


def assert_last_commit(world, root: Path) -> int:
    """The scratch store holds whole groups only, each sample as the uninterrupted run's."""
    store = ShardReader(work_store(root), require_complete=False)
    full = ShardReader(hf_store(world))
    n = len(store)
    assert n % GROUP == 0 and 0 < n < N, n
    assert store.sample_ids == full.sample_ids[:n]
    for i in range(n):
        a, b = store[i], full[full.sample_index(store.sample_ids[i])]
        for key in ("input_ids", "loss_mask", "aux_hidden", "final_hidden"):
            assert torch.equal(a[key], b[key]), (i, key)
    return n


def assert_resumed(world, root: Path, committed: int, caplog) -> None:
    """The rerun resumed from the commit (not from scratch) and wrote the uninterrupted store."""
    resumed = f"resuming {work_store(root / 'x')}: {committed} samples already committed"
    assert resumed in caplog.text
    hf = root / "hf"
    if not hf.exists():
        hf.symlink_to(world["root"] / "hf")
    assert_same_as_hf({**world, "root": root}, "x")


def assert_message(message: str, *, server: str, next_step: str) -> str:
    """One message whose first line names the server, the shard, the store and the next step."""
    first = message.splitlines()[0]
    assert re.search(server, first), first
    assert "extract train/000 stopped" in first and str(Path(".work") / "shard-000.zarr") in first
    assert re.search(next_step, first), first
    assert "Traceback" not in message
    return first


def fault_time(text: str) -> float:
    return float(FAULT_AT.search(text)[1])


def no_request_threads(within: float = 5.0) -> bool:
    """The capture's request threads are gone: nothing holds the job's process open."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not [t for t in threading.enumerate() if t.name.startswith("eyrie-sglang_")]:
            return True
        time.sleep(0.05)
    return False


@contextmanager
def external_process(world, dump: Path, tmp_path: Path, fault: str):
    """A stand-in started by hand in a process of its own, as launch.sh starts SGLang."""
    root = world["root"]
    manifest = world["manifest"]
    args = server_args(root / "patch", manifest, dump, "eyrie-")

    def command(port: int) -> list[str]:
        cmd = capture_command(
            world["target"], port, launcher=STANDIN, chunked_prefill_size=16, patch_args=args
        )
        return [*cmd, "--fault", fault]

    env = server_env(root / "patch", manifest, dump, "eyrie-")
    env["PYTHONPATH"] = os.pathsep.join([str(world["release"].root), env["PYTHONPATH"]])
    with ready_server(command, tmp_path / "external.log", 120, env=env) as server:
        yield server


def launched(world, monkeypatch, tmp_path, **sglang) -> dict:
    """Capture settings of a job that launches its stand-in (the release found for the check)."""
    path = f"{world['release'].root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    monkeypatch.setenv("PYTHONPATH", path)
    return sglang_capture(
        world,
        launcher=STANDIN,
        chunked_prefill_size=16,
        concurrency=3,
        log_dir=str(tmp_path / "logs"),
        **sglang,
    )


def job_error(capture, world, root: Path, **kw) -> tuple[SglangError, float]:
    """(the job's error, time.time() when it came)."""
    with pytest.raises(SglangError) as e:
        run(root, "x", capture, world["target"], world["data"], **kw)
    return e.value, time.time()


# ---------------------------------------------------------------------------------------------
# 1. killed


def test_a_launched_server_killed_mid_job_stops_it_at_once(world, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    capture = launched(world, monkeypatch, tmp_path)
    # the fault comes through the server's environment: the rerun's config is the same
    monkeypatch.setenv("EYRIE_STANDIN_FAULT", f"die_after:{AFTER}")
    error, at = job_error(capture, world, tmp_path)
    log = tmp_path / "logs" / "shard-000.sglang.log"
    assert at - fault_time(log.read_text()) < 5
    assert_message(
        str(error),
        server=rf"http://127\.0\.0\.1:\d+ \(log {re.escape(str(log))}\) died \(killed by signal "
        "SIGKILL\\)",
        next_step="rerun the job .*--rerun-incomplete.* resumes from the last commit",
    )
    assert "last lines of" in str(error)
    assert no_request_threads()
    committed = assert_last_commit(world, tmp_path / "x")

    monkeypatch.delenv("EYRIE_STANDIN_FAULT")
    out = run(tmp_path, "x", capture, world["target"], world["data"])
    assert out.samples == N
    assert_resumed(world, tmp_path, committed, caplog)


def test_an_external_server_killed_then_restarted(world, tmp_path, monkeypatch, caplog):
    """Killed: nothing listens any more. Restarted (another process, another port): the rerun
    resumes, and the dead server's files in the dump folder are not taken for new dumps."""
    caplog.set_level(logging.INFO)
    dump = tmp_path / "dump"
    with external_process(world, dump, tmp_path, f"die_after:{AFTER}") as server:
        capture = sglang_capture(world, url=server.url, dump_dir=str(dump), concurrency=3)
        error, at = job_error(capture, world, tmp_path)
        dead_pid = server.proc.pid
    assert at - fault_time((tmp_path / "external.log").read_text()) < 5
    assert_message(
        str(error),
        server=rf"{server.url} \(external\) does not answer \((connection refused|connection "
        r"closed by the server)\)",
        next_step=rf"restart it \(.*launch\.sh with EYRIE_PATCH_DUMP_DIR={re.escape(str(dump))}"
        r"\), then rerun the job.* resumes from the last commit",
    )
    assert no_request_threads()
    committed = assert_last_commit(world, tmp_path / "x")
    left = sorted(p.name for p in dump.iterdir() if p.name.endswith(".safetensors"))
    if not left:  # the server died before its writer thread wrote them: leave what it could
        plant_stale_dumps(world["data"], dump, skip=committed)
    assert (dump / f"status-{dead_pid}.json").is_file()

    with inprocess(world, monkeypatch, dump) as (url, _):  # restarted: this process
        capture = sglang_capture(world, url=url, dump_dir=str(dump), concurrency=3)
        out = run(tmp_path, "x", capture, world["target"], world["data"])
    assert out.samples == N
    assert_resumed(world, tmp_path, committed, caplog)
    # A temporary the killed server was writing stays until a sweep finds it older than the
    # timeouts (its pid may live on another host of a shared folder): nothing else is left.
    half_written = re.compile(rf"^\..+\.{dead_pid}\.[0-9a-f]{{8}}\.tmp$")
    statuses = sorted(p.name for p in dump.iterdir() if not half_written.match(p.name))
    assert statuses == sorted([f"status-{dead_pid}.json", f"status-{os.getpid()}.json"])


def test_a_server_restarted_without_the_patch_is_told_from_a_dead_ones_status(
    world, tmp_path, monkeypatch
):
    """The folder still holds the status file of a patched server that died, and files it left
    long ago; the server now at the url runs without the patch. The job stops at its start, on
    a probe request whose dump never comes, instead of after dump_timeout_s on the first
    sample with the dead server's pid named as the patch's."""
    from eyrie.common.provenance import file_sha256
    from eyrie.sglang.patch import protocol as proto

    dump = proto.ensure_private_dir(tmp_path / "dump")
    sha = file_sha256(world["root"] / "patch" / "manifest.json")
    status = {"pid": 999999, "manifest_sha256": sha, "rid_prefix": "eyrie-", "files_ok": True}
    (dump / "status-999999.json").write_text(json.dumps(status))
    old = dump / "0123.0000000000.safetensors"
    old.write_bytes(b"left by a job killed long ago")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    with test_sglang_server.external(world, monkeypatch, dump, hooks=False) as url:
        capture = sglang_capture(world, url=url, dump_dir=str(dump), dump_timeout_s=30)
        t0 = time.monotonic()
        with pytest.raises(SglangError, match="no dump of a probe request reached") as err:
            run(tmp_path, "x", capture, world["target"], world["data"])
    assert time.monotonic() - t0 < 20
    assert "999999" in str(err.value) and "launch.sh" in str(err.value)
    assert sorted(p.name for p in dump.iterdir()) == ["status-999999.json"]  # old file swept


def plant_stale_dumps(data: Path, dump: Path, skip: int) -> None:
    """A dead server's chunk file, holding zeros, for every sample after the first `skip` (the
    committed ones, which are not sent again): a rerun that took one for its own request would
    store other states (or fail to tile the sample)."""
    from eyrie.sglang.patch import protocol as proto

    for line in data.read_text().splitlines()[skip:]:
        rid = f"eyrie-train.000:{json.loads(line)['id']}"
        tensors = {"aux": torch.zeros(2, 3, 32, dtype=torch.bfloat16),
                   "final": torch.zeros(2, 32, dtype=torch.bfloat16),
                   "input_ids": torch.zeros(2, dtype=torch.int64),
                   "positions": torch.arange(2)}  # fmt: skip
        meta = {"rid": rid, "prefix": 0, "tokens": 2}
        proto.save_chunk(dump / proto.chunk_name(rid, 0), tensors, meta)


# ---------------------------------------------------------------------------------------------
# 2. hung


@pytest.mark.parametrize("fault", ["stop", "hang"])
def test_a_hung_server_stops_the_job_after_the_health_window(
    world, tmp_path, monkeypatch, caplog, fault
):
    """stop: SIGSTOP, nothing answers; hang: the scheduler stops and /health answers 503, as
    SGLang's does after SGLANG_HEALTH_CHECK_TIMEOUT. Requests would wait request_timeout_s."""
    caplog.set_level(logging.INFO)
    dump = tmp_path / "dump"
    settings = {"dump_dir": str(dump), "concurrency": 3, "request_timeout_s": 60}
    window = {"health_timeout_s": 4}
    if fault == "stop":
        with external_process(world, dump, tmp_path, f"stop_after:{AFTER}") as server:
            capture = sglang_capture(world, url=server.url, **settings, **window)
            error, at = job_error(capture, world, tmp_path)
            assert no_request_threads()
            t0 = time.monotonic()
        assert time.monotonic() - t0 < 5  # a stopped server is ended without the 20 s grace
        fault_at, probe = fault_time((tmp_path / "external.log").read_text()), "timed out"
    else:
        hang = {"fault": f"hang_after:{AFTER}", "health_check_timeout": 0.5}
        with inprocess(world, monkeypatch, dump, **hang) as (url, standin):
            capture = sglang_capture(world, url=url, **settings, **window)
            error, at = job_error(capture, world, tmp_path)
            assert no_request_threads()
        fault_at, probe = standin.fault_at, "HTTP 503"
    assert fault_at is not None and at - fault_at < 12, (error, at - (fault_at or 0))
    assert_message(
        str(error),
        server=r"\(external\) has not answered GET /health for 4 s \(capture\.sglang\."
        rf"health_timeout_s; last probe: {probe}\): it hangs",
        next_step=r"restart it .* resumes from the last commit",
    )
    committed = assert_last_commit(world, tmp_path / "x")

    with inprocess(world, monkeypatch, dump) as (url, _):  # health_timeout_s: its default
        capture = sglang_capture(world, url=url, **settings)
        run(tmp_path, "x", capture, world["target"], world["data"])
    assert_resumed(world, tmp_path, committed, caplog)


# ---------------------------------------------------------------------------------------------
# 3. and 4. error answers


@pytest.mark.parametrize(
    ("fault", "server", "next_step"),
    [
        (
            "http500",
            r"answered HTTP 500 to sample '\w+': Internal Server Error",
            r"see its log for the error; if it no longer serves, restart it .* resumes from the "
            "last commit",
        ),
        (
            "abort",
            r"aborted sample '\w+' \(Abort in waiting queue\): an /abort_request call",
            r"if it is shutting down, restart it .* resumes from the last commit",
        ),
        (  # KV cache exhausted (ScheduleBatch.retract_decode's abort)
            "oom",
            r"ran out of KV cache memory \(answered HTTP 500 to sample '\w+': Out of memory "
            "even after retracting",
            r"lower capture\.sglang\.concurrency \(the rerun resumes from the last commit\), "
            r"or .* higher --mem-fraction-static",
        ),
    ],
)
def test_error_answers_stop_the_job_clearly(
    world, tmp_path, monkeypatch, caplog, fault, server, next_step
):
    caplog.set_level(logging.INFO)
    dump = tmp_path / "dump"
    with inprocess(world, monkeypatch, dump, fault=f"{fault}_after:{AFTER}") as (url, standin):
        capture = sglang_capture(world, url=url, dump_dir=str(dump), concurrency=3)
        error, at = job_error(capture, world, tmp_path)
    assert at - standin.fault_at < 5
    assert_message(str(error), server=server, next_step=next_step)
    assert no_request_threads()
    committed = assert_last_commit(world, tmp_path / "x")

    # fewer requests at a time, as the out-of-memory message says: the store still resumes
    with inprocess(world, monkeypatch, dump) as (url, _):
        capture = sglang_capture(world, url=url, dump_dir=str(dump), concurrency=2)
        run(tmp_path, "x", capture, world["target"], world["data"])
    assert_resumed(world, tmp_path, committed, caplog)
    assert sorted(p.name for p in dump.iterdir() if not p.name.startswith("status-")) == []


def test_a_sample_longer_than_the_kv_cache_pool_is_listed_with_the_fix(
    world, tmp_path, monkeypatch, caplog
):
    """SGLang refuses a prompt its KV cache pool cannot hold (scheduler validate_input_length:
    an abort with status 400, after a one-token prefill under the request's rid). Every rerun
    would meet it again, so the sample is listed and the job goes on."""
    caplog.set_level(logging.INFO)
    dump, pool = tmp_path / "dump", 66  # prompts of 60 tokens or more do not fit
    with inprocess(world, monkeypatch, dump, max_total_tokens=pool) as (url, _):
        capture = sglang_capture(world, url=url, dump_dir=str(dump), concurrency=3)
        run(tmp_path, "x", capture, world["target"], world["data"], stop_after=1)
        out = run(tmp_path, "x", capture, world["target"], world["data"])
    assert "samples already committed" in caplog.text
    errors = read_errors(tmp_path / "x" / "shard-000.errors.csv")
    full = ShardReader(hf_store(world))
    lengths = {sid: len(full[full.sample_index(sid)]["input_ids"]) for sid in full.sample_ids}
    assert {sid for sid, _, _ in errors.values()} == {s for s, n in lengths.items() if n >= 60}
    assert 0 < len(errors) < N and out.errors == {"server_rejected": len(errors)}
    for _, _, detail in errors.values():
        assert re.search(
            r"HTTP 400: Input length \(\d+ tokens\) exceeds the maximum allowed length \(60 "
            r"tokens\).*KV cache pool holds fewer tokens than this sample: restart the server "
            r"with a higher --mem-fraction-static or more GPUs \(--tp\), or lower "
            r"dataset\.max_tokens",
            detail,
        ), detail
    store = ShardReader(tmp_path / "x" / "shard-000.zarr")
    assert len(store) == N - len(errors)
    for sid in store.sample_ids:
        a, b = store[store.sample_index(sid)], full[full.sample_index(sid)]
        assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "aux_hidden", "final_hidden"))
    # the one-token prefill SGLang runs for a refused prompt left no dump behind
    assert sorted(p.name for p in dump.iterdir() if not p.name.startswith("status-")) == []


# ---------------------------------------------------------------------------------------------
# pieces


class _Dead:
    def alive(self) -> bool:
        return False

    def exit_description(self) -> str:
        return "killed by signal SIGKILL"


@pytest.mark.parametrize(
    ("line", "advice"),
    [
        ("RuntimeError: Prefill out of memory. Try to lower your batch size.", "more KV cache"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "activations"),
        ("Scheduler hit an exception: ValueError: boom", "see its log for why; rerun the job"),
    ],
)
def test_a_dead_servers_log_names_the_fix(tmp_path, line, advice):
    from eyrie.extract.sglang_faults import Place, Watch

    log = tmp_path / "s.log"
    log.write_text(f"starting\n[2026-12-03 10:00:00] {line}\nmore\n")
    place = Place("http://127.0.0.1:1", log=log, shard="train/000", store=tmp_path / "w")
    with pytest.raises(SglangError) as e:
        Watch(place, _Dead(), 60).check(3)
    first = str(e.value).splitlines()[0]
    assert "died (killed by signal SIGKILL) with 3 requests waiting" in first
    assert advice in first and "extract train/000 stopped" in first


def test_answers_read_as_sglang_writes_them(tmp_path):
    from eyrie.extract.sglang_faults import Place, read_answer

    place = Place("http://127.0.0.1:1", shard="train/000", store=tmp_path / "w")
    context = {"error": {"message": "The input (90 tokens) is longer than the model's context"}}
    assert read_answer(place, "s", 400, context) == (
        "error",
        "server_rejected",
        "HTTP 400: The input (90 tokens) is longer than the model's context",
    )
    queue = {"object": "error", "message": "The request queue is full.", "code": 503}
    with pytest.raises(SglangError, match=r"overloaded .*queue is full.*lower capture\.sglang\."):
        raise read_answer(place, "s", 503, queue)
    with pytest.raises(SglangError, match=r"HTTP 404 .*check that capture\.sglang\.url"):
        raise read_answer(place, "s", 404, {"detail": "Not Found"})
    assert read_answer(place, "s", 200, {"output_ids": [1], "meta_info": {}}) is None


def test_stopping_a_stopped_server_does_not_wait_the_grace(tmp_path):
    """A server that handles SIGTERM (SGLang shuts down on it) acts on it only once it runs."""
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))"
    cmd = [sys.executable, "-c", f"{code}; print('up', flush=True); time.sleep(60)"]
    with SglangServer(cmd, tmp_path / "s.log", 1) as server:
        while "\nup\n" not in (tmp_path / "s.log").read_text():
            time.sleep(0.05)
        os.kill(server.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 5 and server.proc.returncode == 7


# ---------------------------------------------------------------------------------------------
# servers


@contextmanager
def inprocess(world, monkeypatch, dump: Path, **kw):
    """(url, StandIn) of a stand-in in this process, started with the bundle as by hand."""
    from e2e.standin import StandIn, serve

    from eyrie.sglang.patch.hooks import hook_specs

    monkeypatch.syspath_prepend(str(world["root"] / "patch" / "python"))
    monkeypatch.syspath_prepend(str(world["release"].root))
    manifest_path = world["root"] / "patch" / "manifest.json"
    specs = hook_specs(world["manifest"], str(manifest_path), str(dump), "eyrie-")
    standin = StandIn(world["target"], specs, chunked_prefill_size=16, **kw)
    server = serve(standin, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the stand-in's own process runs: the same float sums
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", standin
    finally:
        torch.set_num_threads(threads)
        server.shutdown()
        standin.stop()
