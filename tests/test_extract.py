"""Extraction end to end: membership, errors table, values, and bit-exact resume after a kill."""

from __future__ import annotations

import csv
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from tiny_target import build_llama, write_split

from eyrie.data.split import read_split, shard_members
from eyrie.extract.job import work_paths
from eyrie.extract.shard import ExtractJob, ShardTask, capture_for, extract_shard
from eyrie.target.load import TargetError

N = 24
MAX_TOKENS = 80
CAPTURE = {"backend": "hf", "aux_layer_ids": None, "device": "cpu", "batch_size": 3}
EXTRACT = {"shards": 2, "chunk_tokens": 32, "shard_tokens": 256}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("extract")
    target = build_llama(root / "target", layers=8)
    data = write_split(root / "data" / "train.jsonl", N)
    with open(data, "a", encoding="utf-8") as f:  # a repeated id and a line without messages
        f.write(json.dumps({"id": "s004", "messages": [{"role": "user", "content": "x"}]}) + "\n")
        f.write(json.dumps({"id": "bare"}) + "\n")
    return root, target, data


def run(setup, out: Path, shard=0, capture=CAPTURE, extract=EXTRACT, stop_after=None, **kw):
    """Extract shard `shard` into `out`; stop_after=N: stop after N commits (see stopped)."""
    root, target, data = setup
    kw.setdefault("max_tokens", MAX_TOKENS)
    task = ShardTask(
        data_path=data,
        target_path=target,
        split="train",
        shard=shard,
        out_store=out / f"shard-{shard:03d}.zarr",
        errors_csv=out / f"shard-{shard:03d}.errors.csv",
        capture=capture,
        extract=extract,
        commit_every=3,
        progress=False,
        **kw,
    )
    if stop_after is not None:
        return stopped(task, stop_after)
    return extract_shard(**vars(task))


def stopped(task: ShardTask, commits: int, target=None) -> None:
    """Run a job's first `commits` commit groups and stop without placing its store: what a
    killed job leaves, with exactly those commits on disk."""
    with ExtractJob(task, capture_for(task, target)) as job:
        job.plan()
        assert len(job.groups) > commits, "too few groups left to stop early"
        del job.groups[commits:]
        job.run()


def read_store(path: Path) -> dict:
    group = zarr.open_group(str(path), mode="r")
    out = {name: np.asarray(group[name][:]) for name in group.array_keys()}
    out["attrs"] = dict(group.attrs)
    out["commit"] = json.loads((path / "commit.json").read_text())
    return out


def assert_same_store(a: Path, b: Path) -> None:
    x, y = read_store(a), read_store(b)
    assert x.keys() == y.keys()
    for key in x:
        if isinstance(x[key], np.ndarray):
            assert x[key].dtype == y[key].dtype and np.array_equal(x[key], y[key]), key
        else:
            assert x[key] == y[key], key


def errors_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def uninterrupted(setup, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    outcomes = [run(setup, out, shard=s) for s in (0, 1)]
    return out, outcomes


def test_every_sample_is_stored_or_listed(setup, uninterrupted):
    _, _, data = setup
    out, outcomes = uninterrupted
    records = read_split(data)
    seen_lines = []
    for shard in (0, 1):
        store = read_store(out / f"shard-{shard:03d}.zarr")
        rows = errors_rows(out / f"shard-{shard:03d}.errors.csv")
        members = shard_members(records, shard, 2)
        ids = list(store["sample_id"])
        assert len(ids) == len(set(ids)) == outcomes[shard].samples
        listed = {int(r["line"]) for r in rows}
        by_id = {}
        for r in members:
            by_id.setdefault(r.sample_id, r.line)  # a repeated id names its first line
        stored_lines = {by_id[i] for i in ids}
        assert stored_lines.isdisjoint(listed)
        assert stored_lines | listed == {r.line for r in members}
        seen_lines += [*stored_lines, *listed]
        assert store["attrs"]["complete"] is True
        assert store["attrs"]["aux_layer_ids"] == [1, 3, 4]
        assert store["offsets"][-1] == store["commit"]["num_tokens"] == outcomes[shard].tokens
    assert sorted(seen_lines) == list(range(1, N + 3))
    reasons = {
        r["sample_id"]: r["reason"]
        for s in (0, 1)
        for r in errors_rows(out / f"shard-{s:03d}.errors.csv")
    }
    assert reasons["bare"] == "bad_line"
    assert "too_long" in reasons.values()
    dup = [
        r
        for s in (0, 1)
        for r in errors_rows(out / f"shard-{s:03d}.errors.csv")
        if r["reason"] == "duplicate_id"
    ]
    assert [(r["sample_id"], r["line"]) for r in dup] == [("s004", str(N + 1))]
    assert not any(work_paths(out / "x.zarr", out / "x.csv")[0].parent.glob("*"))


def test_stored_values_match_plain_forward(setup, uninterrupted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, target, data = setup
    out, _ = uninterrupted
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    tok = AutoTokenizer.from_pretrained(target)
    msgs = {r.sample_id: r.messages for r in read_split(data)}
    store = read_store(out / "shard-001.zarr")
    off = store["offsets"]
    for i, sid in enumerate(store["sample_id"]):
        ids = store["input_ids"][off[i] : off[i + 1]]
        ref_ids = tok.apply_chat_template(msgs[sid], tokenize=True)["input_ids"][:MAX_TOKENS]
        assert ids.tolist() == ref_ids
        with torch.no_grad():
            hs = model(torch.as_tensor(ids, dtype=torch.long)[None], output_hidden_states=True)
        aux = torch.from_numpy(store["aux_hidden"][off[i] : off[i + 1]].view(np.int16))
        aux = aux.view(torch.bfloat16)
        for j, layer in enumerate([1, 3, 4]):
            torch.testing.assert_close(aux[:, j], hs.hidden_states[layer + 1][0].bfloat16())
        final = torch.from_numpy(store["final_hidden"][off[i] : off[i + 1]].view(np.int16))
        torch.testing.assert_close(final.view(torch.bfloat16), hs.hidden_states[-1][0].bfloat16())
        mask = store["loss_mask"][off[i] : off[i + 1]]
        text = tok.decode(ids[mask.astype(bool)])  # cut samples end mid-answer
        assert text and text[:6] == "Answer"[: len(text)]


def test_interrupted_and_resumed_is_bit_exact(setup, uninterrupted, tmp_path):
    full, _ = uninterrupted
    run(setup, tmp_path, stop_after=2)
    work_store, work_errors = work_paths(tmp_path / "shard-000.zarr", tmp_path / "x.csv")
    assert work_store.is_dir() and not (tmp_path / "shard-000.zarr").exists()
    committed = read_store(work_store)["commit"]["num_samples"]
    assert 0 < committed < read_store(full / "shard-000.zarr")["commit"]["num_samples"]
    run(setup, tmp_path, stop_after=1)  # a second interruption, on the resumed run
    run(setup, tmp_path)
    assert_same_store(tmp_path / "shard-000.zarr", full / "shard-000.zarr")
    assert errors_rows(tmp_path / "shard-000.errors.csv") == errors_rows(
        full / "shard-000.errors.csv"
    )


def test_non_finite_states_are_listed_not_stored(setup, uninterrupted, tmp_path, monkeypatch):
    """A sample whose captured bf16 states hold Inf, -Inf or NaN is an error row, not stored."""
    from eyrie.extract.hf import HFCapture

    real, poison = HFCapture.capture_pending, iter([float("inf"), float("-inf"), float("nan")])

    def poisoned(self, sequences, host=None):
        pending = real(self, sequences, host)
        aux, final = pending.result()[-1]  # the batch's last sample
        value = next(poison, None)
        if value is not None:
            (aux if value != float("-inf") else final).view(-1)[-1] = value
        return pending

    monkeypatch.setattr(HFCapture, "capture_pending", poisoned)
    outcome = run(setup, tmp_path)
    full, outcomes = uninterrupted
    bad = [r for r in errors_rows(tmp_path / "shard-000.errors.csv") if r["reason"] == "non_finite"]
    assert len(bad) == 3 and outcome.samples == outcomes[0].samples - 3
    stored = set(read_store(tmp_path / "shard-000.zarr")["sample_id"])
    assert stored == set(read_store(full / "shard-000.zarr")["sample_id"]) - {
        r["sample_id"] for r in bad
    }


def test_changed_setup_restarts_the_scratch_store(setup, tmp_path):
    run(setup, tmp_path / "a", stop_after=1)
    run(setup, tmp_path / "a", max_tokens=60)
    run(setup, tmp_path / "b", max_tokens=60)
    assert_same_store(tmp_path / "a" / "shard-000.zarr", tmp_path / "b" / "shard-000.zarr")


DRIVER_TEXT = textwrap.dedent(
    """
    import sys, time
    import eyrie.extract.hf as cap
    from eyrie.extract.shard import extract_shard

    slow = float(sys.argv[2])
    if slow:
        orig = cap.HFCapture.capture_pending  # the extract loop's (and capture()'s) entry
        def capture_pending(self, seqs, host=None):
            time.sleep(slow)
            return orig(self, seqs, host)
        cap.HFCapture.capture_pending = capture_pending
    out = sys.argv[1]
    extract_shard(data_path=sys.argv[3], target_path=sys.argv[4], split="train", shard=0,
                  out_store=out + "/shard-000.zarr", errors_csv=out + "/shard-000.errors.csv",
                  capture={CAPTURE!r}, extract={EXTRACT!r}, max_tokens={MAX_TOKENS},
                  commit_every=int(sys.argv[5]) if len(sys.argv) > 5 else 3, progress=False)
    """
)


def driver(extract: dict = EXTRACT) -> str:
    """A script extracting shard 0 (argv: out, capture delay, data, target[, commit_every])."""
    return DRIVER_TEXT.format(CAPTURE=CAPTURE, EXTRACT=extract, MAX_TOKENS=MAX_TOKENS)


DRIVER = driver()


# SIGKILLs that must land while extraction is running; EYRIE_FULL_TESTS=1 for the full count.
KILLS = 10 if os.environ.get("EYRIE_FULL_TESTS") == "1" else 2


def kill_and_resume(setup, tmp_path, driver_text, *, kills, seed, wait, ready=None, killed=None):
    """Run `driver_text` (DRIVER's arguments) in fresh processes, SIGKILL each at a random point
    `wait` seconds after its scratch store appears, until `kills` kills landed; then finish it
    and a clean run. `ready(proc)` may refuse a kill (False) or prepare it; `killed(proc)` runs
    after each. Returns the resumed and the clean output folders."""
    root, target, data = setup
    driver = tmp_path / "driver.py"
    driver.write_text(driver_text)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}

    def start(out: Path, slow: float) -> subprocess.Popen:
        cmd = [sys.executable, str(driver), str(out), str(slow), str(data), str(target)]
        return subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)

    rng = random.Random(seed)
    resumed = tmp_path / "killed"
    work_store = work_paths(resumed / "shard-000.zarr", resumed / "x")[0]
    landed = 0
    for _ in range(4 * kills):
        if landed == kills:
            break
        if (resumed / "shard-000.zarr").exists():  # a run finished before its kill: start over
            shutil.rmtree(resumed)
        proc = start(resumed, 0.3)
        deadline = time.monotonic() + 120
        while proc.poll() is None and not work_store.exists() and time.monotonic() < deadline:
            time.sleep(0.01)  # the store appears once imports and model loading are done
        time.sleep(rng.uniform(*wait))
        if proc.poll() is None and (ready is None or ready(proc) is not False):
            os.kill(proc.pid, signal.SIGKILL)
            landed += 1
            proc.wait()
            if killed is not None:
                killed(proc)
        proc.wait()
    assert landed == kills
    clean = tmp_path / "clean"
    for out in (resumed, clean):
        assert start(out, 0).wait() == 0
    return resumed, clean


def test_sigkill_at_random_points_then_resume_is_bit_exact(setup, tmp_path):
    """Real SIGKILLs at random points of the work, each followed by a resume; the end result
    equals an uninterrupted run bit for bit. Every run is a fresh process, same thread count."""
    resumed, clean = kill_and_resume(
        setup, tmp_path, DRIVER, kills=KILLS, seed=1234, wait=(0.0, 2.0)
    )
    assert_same_store(resumed / "shard-000.zarr", clean / "shard-000.zarr")
    assert errors_rows(resumed / "shard-000.errors.csv") == errors_rows(
        clean / "shard-000.errors.csv"
    )


def test_second_writer_with_another_setup_is_refused_and_the_first_is_intact(
    setup, uninterrupted, tmp_path
):
    """Two real processes on one shard: B (another commit_every, so another setup) starts while
    A is writing. B must neither delete nor write A's store: it is refused, naming the store and
    A's pid, and A's store equals a single writer's bit for bit."""
    root, target, data = setup
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    out = tmp_path / "out"
    work_store = work_paths(out / "shard-000.zarr", out / "x")[0]
    cmd = [sys.executable, str(driver), str(out)]
    a = subprocess.Popen([*cmd, "3", str(data), str(target)], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while a.poll() is None and not work_store.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert a.poll() is None, "writer A finished before B started; make A slower"
    b = subprocess.run(
        [*cmd, "0", str(data), str(target), "6"], env=env, capture_output=True, text=True
    )
    a_running_after_b = a.poll() is None
    a_err = a.communicate(timeout=300)[1].decode()
    assert a.returncode == 0, a_err
    assert b.returncode != 0, "the second writer was not refused"
    assert "being written by another process" in b.stderr
    assert str(work_store) in b.stderr and f"pid {a.pid} " in b.stderr
    assert a_running_after_b  # B was refused while A ran, not after it
    full, _ = uninterrupted
    assert_same_store(out / "shard-000.zarr", full / "shard-000.zarr")
    assert errors_rows(out / "shard-000.errors.csv") == errors_rows(full / "shard-000.errors.csv")
    assert not work_store.parent.exists()  # the lock file went with the scratch folder


def test_missing_target_names_the_key(setup, tmp_path):
    root, _, data = setup
    with pytest.raises(TargetError, match=r"target\.path: .*nowhere"):
        extract_shard(
            data_path=data,
            target_path=tmp_path / "nowhere",
            split="train",
            shard=0,
            out_store=tmp_path / "s.zarr",
            errors_csv=tmp_path / "e.csv",
            capture=CAPTURE,
            extract=EXTRACT,
            max_tokens=MAX_TOKENS,
            progress=False,
        )


def test_target_without_chat_template_is_refused(setup, tmp_path):
    import shutil

    from eyrie.target.load import load_tokenizer

    _, target, _ = setup
    copy = shutil.copytree(target, tmp_path / "t")
    (copy / "chat_template.jinja").unlink()
    cfg = json.loads((copy / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (copy / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(TargetError, match=r"target\.path: .*no chat template"):
        load_tokenizer(copy)


def test_target_without_tokenizer_is_refused(setup, tmp_path):
    from eyrie.target.load import load_tokenizer

    _, target, _ = setup
    (tmp_path / "t").mkdir()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "t" / name).write_bytes((target / name).read_bytes())
    with pytest.raises(TargetError, match=r"target\.path: .*holds no tokenizer"):
        load_tokenizer(tmp_path / "t")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_gpu_is_a_clear_error():
    from eyrie.target.load import resolve_device

    with pytest.raises(TargetError, match="capture.device is 'cuda'"):
        resolve_device("cuda")


def test_disk_full_names_store_space_and_resumes_bit_exact(
    setup, uninterrupted, tmp_path, monkeypatch
):
    """ENOSPC from the shard file writes (zarr's, or Eyrie's encoder's) in the third commit: a
    clear ExtractError (store, space needed and free, rerun resumes), and the rerun gives the
    single-run store exactly."""
    import errno

    import zarr.storage

    from eyrie.common.errors import ExtractError

    real_set, calls = zarr.storage.LocalStore.set, {"commit": 0}
    import eyrie.store.shard as store_mod

    real_commit = store_mod.ShardWriter.commit

    def commit(self):
        calls["commit"] += 1
        return real_commit(self)

    async def full_set(self, key, value, *args, **kwargs):
        if calls["commit"] >= 3 and "aux_hidden/c" in key:
            raise OSError(errno.ENOSPC, "No space left on device", key)
        return await real_set(self, key, value, *args, **kwargs)

    import eyrie.store.shard_files as shard_files

    real_write = shard_files.write_bytes_durable

    def full_write(path, pieces):  # the token arrays' shard files, written by Eyrie's encoder
        if calls["commit"] >= 3 and "aux_hidden/c" in path.as_posix():
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_write(path, pieces)

    monkeypatch.setattr(store_mod.ShardWriter, "commit", commit)
    monkeypatch.setattr(zarr.storage.LocalStore, "set", full_set)
    monkeypatch.setattr(shard_files, "write_bytes_durable", full_write)
    out = tmp_path / "out"
    with pytest.raises(ExtractError) as err:
        run(setup, out)
    msg = str(err.value)
    work = work_paths(out / "shard-000.zarr", out / "x")[0]
    assert f"the disk is full while writing shard store {work}" in msg
    assert re.search(r"needs about [\d.]+ [KMG]?B more for the \d+ tokens left", msg), msg
    assert re.search(r"[\d.]+ [KMGT]?B is free on its file system", msg), msg
    assert "rerun the same command: it resumes from the last commit" in msg
    assert "Traceback" not in msg and not (out / "shard-000.zarr").exists()
    monkeypatch.undo()
    run(setup, out)
    full, _ = uninterrupted
    assert_same_store(out / "shard-000.zarr", full / "shard-000.zarr")
    assert errors_rows(out / "shard-000.errors.csv") == errors_rows(full / "shard-000.errors.csv")
