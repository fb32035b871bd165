"""A writer SIGKILLed at random points and rerun each time ends with the uninterrupted store.

Run as a script, this file is that writer: deterministic samples from their index, a commit
every few samples, finish at the end, skipping what a previous run committed.
Set EYRIE_FULL_TESTS=1 for at least 10 kills (3 by default).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

H, AUX, N_SAMPLES, COMMIT_EVERY = 96, [0, 2, 5], 60, 5
PROV = {"target": "crash-test", "backend": "synthetic"}


def sample(i: int):
    """Sample i, from its index alone, so every run produces the same bytes."""
    import torch

    rng = np.random.default_rng(i)
    t = int(rng.integers(3, 120))
    aux = torch.from_numpy(rng.standard_normal((t, len(AUX), H), dtype=np.float32))
    fin = torch.from_numpy(rng.standard_normal((t, H), dtype=np.float32))
    return rng.integers(0, 32_000, t), rng.integers(0, 2, t).astype(bool), aux, fin


def write(path: str, die_before_commit: int | None) -> None:
    from eyrie.store.shard import ShardWriter

    if die_before_commit is not None:  # die right before the n-th commit record: data written
        calls = [0]
        real = ShardWriter._write_commit_record

        def maybe_die(self, *args):
            calls[0] += 1
            if calls[0] == die_before_commit:
                os._exit(9)
            real(self, *args)

        ShardWriter._write_commit_record = maybe_die

    w = ShardWriter(
        path,
        hidden_size=H,
        aux_layer_ids=AUX,
        provenance=PROV,
        chunk_tokens=32,
        shard_tokens=128,
    )
    done = set(w.committed_ids)
    print("ready", flush=True)
    start = time.perf_counter()
    for i in range(N_SAMPLES):
        sid = f"sample-{i:04d}"
        if sid in done:
            continue
        w.append(sid, *sample(i))
        if w.buffered_samples >= COMMIT_EVERY:
            w.commit()
    w.finish()
    w.close()
    print(f"done {time.perf_counter() - start:.3f}", flush=True)


# -- the test ------------------------------------------------------------------------------------


def _cmd(store: Path, *extra: str) -> list[str]:
    return [sys.executable, __file__, str(store), *extra]


def _run_to_end(store: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(_cmd(store, *extra), capture_output=True, text=True, timeout=300)


def _run_and_kill(store: Path, delay: float) -> bool:
    """Start a writer, SIGKILL it `delay` s after it is ready; True if it died mid-work."""
    proc = subprocess.Popen(_cmd(store), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if line.strip() != "ready":
            proc.wait(timeout=60)
            raise AssertionError(f"writer failed before starting: {line}{proc.stderr.read()}")
        time.sleep(delay)
        if proc.poll() is None:
            proc.kill()  # SIGKILL: no cleanup handlers run
        proc.wait(timeout=60)
        finished = "done" in proc.stdout.read()
        assert finished or proc.returncode == -9, proc.stderr.read()
        return not finished
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def _snapshot(store: Path) -> dict:
    """Every array value, the attributes and the commit record, read with plain zarr."""
    import zarr

    g = zarr.open_group(str(store), mode="r")
    out = {name: g[name][:] for name in ("input_ids", "loss_mask", "aux_hidden", "final_hidden")}
    out["offsets"] = g["offsets"][:]
    out["sample_id"] = [str(s) for s in g["sample_id"][:]]
    out["attrs"] = g.attrs.asdict()
    out["commit"] = json.loads((store / "commit.json").read_text())
    return out


def _assert_identical(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, np.ndarray):
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
            np.testing.assert_array_equal(got[key], value, err_msg=key)
        else:
            assert got[key] == value, key


def _leftovers(store: Path) -> list[str]:
    temps = [p for p in store.rglob("*") if p.name.endswith((".partial", ".eyrie-tmp"))]
    temps += list(store.parent.glob(f".{store.name}.eyrie-tmp-*"))
    return [str(p) for p in temps]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[dict, float]:
    """The uninterrupted run: its store's snapshot and its work time (s, after start-up)."""
    store = tmp_path_factory.mktemp("crash") / "reference"
    done = _run_to_end(store)
    assert done.returncode == 0, done.stderr
    want = _snapshot(store)
    assert want["attrs"]["complete"] is True and len(want["sample_id"]) == N_SAMPLES
    return want, float(done.stdout.split()[-1])


def test_killed_writer_resumes_to_the_identical_store(tmp_path, reference):
    kills_wanted = 10 if os.environ.get("EYRIE_FULL_TESTS") == "1" else 3
    want, work_s = reference

    rnd = random.Random(int(os.environ.get("EYRIE_CRASH_SEED", "0")))
    kills, lineage = 0, 0
    while kills < kills_wanted:
        store = tmp_path / f"killed-{lineage}"
        lineage += 1
        # Spread the kills so that several land before the work is done.
        while kills < kills_wanted and _run_and_kill(store, rnd.uniform(0, 2 * work_s / 4)):
            kills += 1
            commit = json.loads((store / "commit.json").read_text())
            print(f"kill {kills}: {commit['num_samples']}/{N_SAMPLES} samples committed")
        done = _run_to_end(store)
        assert done.returncode == 0, done.stderr
        _assert_identical(_snapshot(store), want)
        assert _leftovers(store) == []
        assert lineage < 20, "kills never landed; the writer finishes too fast"
    assert kills >= kills_wanted


def test_death_between_data_and_commit_record(tmp_path, reference):
    """Deterministic: all data of commit 3 is written, then the writer dies before recording it."""
    store = tmp_path / "store"
    died = _run_to_end(store, "--die-before-commit", "3")
    assert died.returncode == 9
    from eyrie.store.shard import ShardReader

    part = ShardReader(store, require_complete=False)
    assert len(part) == 2 * COMMIT_EVERY  # commits 1 and 2 only
    assert _run_to_end(store).returncode == 0
    _assert_identical(_snapshot(store), reference[0])


if __name__ == "__main__":
    args = sys.argv[1:]
    die = None
    if "--die-before-commit" in args:
        j = args.index("--die-before-commit")
        die = int(args[j + 1])
        del args[j : j + 2]
    write(args[0], die)
