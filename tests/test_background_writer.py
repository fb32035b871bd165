"""The extract loop's writer thread: order, bounded queue, errors in the caller's thread, and
stores identical to inline writing, including after a writer failure and a resume."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import zarr
from tiny_target import build_llama, write_split

from eyrie.extract.job import work_paths
from eyrie.extract.shard import ExtractJob, ShardTask, capture_for
from eyrie.store.background import BackgroundWriter, InlineWriter, start_writer
from eyrie.store.group_writer import Writing
from eyrie.store.shard import ShardWriter, StoreError


def test_jobs_run_in_order_on_one_thread():
    seen, threads = [], set()
    with BackgroundWriter(depth=2) as bg:
        for i in range(50):
            bg.submit(lambda i=i: (seen.append(i), threads.add(threading.get_ident())))
    assert seen == list(range(50))
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_queue_is_bounded():
    release, started = threading.Event(), threading.Event()
    bg = BackgroundWriter(depth=1)

    def slow():
        started.set()
        release.wait(10)

    bg.submit(slow)  # running
    started.wait(5)
    bg.submit(lambda: None)  # waiting in the queue (depth 1)
    blocked = threading.Thread(target=bg.submit, args=(lambda: None,))
    blocked.start()
    time.sleep(0.3)
    assert blocked.is_alive()  # a third job must wait for room
    release.set()
    blocked.join(5)
    assert not blocked.is_alive()
    bg.close()
    assert bg.waited_s >= 0.0


def test_error_surfaces_in_the_callers_thread_and_stops_later_jobs():
    ran = []
    bg = BackgroundWriter(depth=1)
    bg.submit(lambda: ran.append(1))

    def boom():
        raise StoreError("disk full")

    bg.submit(boom)
    with pytest.raises(StoreError, match="disk full"):
        for _ in range(100):  # the error shows at a later submit (or wait)
            bg.submit(lambda: ran.append(2))
            time.sleep(0.01)
    with pytest.raises(StoreError, match="disk full"):
        bg.wait()
    with pytest.raises(StoreError, match="disk full"):
        bg.close()
    assert 2 not in ran  # nothing ran after the failure


def test_inline_writer_and_depth_zero():
    assert isinstance(start_writer(0), InlineWriter)
    out = []
    with start_writer(0) as w:
        w.submit(out.append, 1)
        assert out == [1]  # at once, on this thread
    with pytest.raises(ValueError):
        BackgroundWriter(depth=0)


# ---------------------------------------------------------------------------------------------
# extraction with the writer thread

CAPTURE = {"backend": "hf", "aux_layer_ids": None, "device": "cpu", "batch_size": 2}
EXTRACT = {"shards": 1, "chunk_tokens": 32, "shard_tokens": 256}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("bgw")
    return build_llama(root / "target", layers=8), write_split(root / "train.jsonl", 10)


def run(setup, out, writing: Writing):
    target, data = setup
    task = ShardTask(
        data_path=data,
        target_path=target,
        split="train",
        shard=0,
        out_store=out / "shard-000.zarr",
        errors_csv=out / "shard-000.errors.csv",
        capture=CAPTURE,
        extract=EXTRACT,
        max_tokens=64,
        commit_every=2,
        progress=False,
    )
    return ExtractJob(task, capture_for(task), writing).execute()


def contents(path) -> dict:
    g = zarr.open_group(str(path), mode="r")
    out = {name: np.asarray(g[name][:]) for name in g.array_keys()}
    out["commit"] = json.loads((path / "commit.json").read_text())
    return out


def same(a, b) -> bool:
    x, y = contents(a), contents(b)
    return x.keys() == y.keys() and all(
        np.array_equal(x[k], y[k]) if isinstance(x[k], np.ndarray) else x[k] == y[k] for k in x
    )


def test_writer_thread_failure_then_resume_equals_inline(setup, tmp_path, monkeypatch):
    inline = run(setup, tmp_path / "inline", Writing("inline", depth=0))
    threaded = run(setup, tmp_path / "threaded", Writing("thread", depth=2))
    assert inline.samples == threaded.samples > 0 and inline.seconds["wait"] == 0.0
    assert same(tmp_path / "inline" / "shard-000.zarr", tmp_path / "threaded" / "shard-000.zarr")
    assert threaded.seconds["write"] > 0 and "wait" in threaded.seconds

    real_commit, calls, threads = ShardWriter.commit, [], set()

    def failing_commit(self):
        calls.append(self.buffered_samples)
        threads.add(threading.current_thread().name)
        if len(calls) == 2:
            raise StoreError("disk full (injected)")
        real_commit(self)

    monkeypatch.setattr(ShardWriter, "commit", failing_commit)
    with pytest.raises(StoreError, match="injected"):  # raised in this thread
        run(setup, tmp_path / "failed", Writing("thread", depth=1))
    assert threads == {"eyrie-writer"}
    work, _ = work_paths(tmp_path / "failed" / "shard-000.zarr", tmp_path / "x.csv")
    assert json.loads((work / "commit.json").read_text())["num_samples"] == calls[0]
    assert len(calls) == 2  # nothing committed after the failure
    monkeypatch.setattr(ShardWriter, "commit", real_commit)
    run(setup, tmp_path / "failed", Writing("thread", depth=1))  # resumes from the first commit
    assert same(tmp_path / "failed" / "shard-000.zarr", tmp_path / "inline" / "shard-000.zarr")
