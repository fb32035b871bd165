"""The extract job's writer in a process of its own (eyrie/store/writer_process.py).

The writer thread is the reference: the same job with the writer in a child process must leave
the same bytes, the same errors table, the same resume after a SIGKILL, and errors of the same
classes. CUDA-only checks skip without a GPU.
"""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from test_extract import CAPTURE, EXTRACT, driver, errors_rows, kill_and_resume, run
from tiny_target import build_llama, write_split

from eyrie.common.disk_full import is_disk_full
from eyrie.common.errors import ExtractError
from eyrie.extract.job import layout
from eyrie.extract.writing import use_writer_process
from eyrie.store.format import StoreError
from eyrie.store.lock import StoreLock
from eyrie.store.slabs import SlabPool, supported
from eyrie.store.writer import ShardWriter
from eyrie.store.writer_process import WriterProcess, WriterProcessError, rebuilt

pytestmark = pytest.mark.skipif(not supported(), reason="the writer process needs Linux")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("write-process")
    return root, build_llama(root / "target", layers=8), write_split(root / "train.jsonl", 24)


def file_hashes(folder: Path) -> dict:
    return {
        str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(folder.rglob("*"))
        if f.is_file()
    }


def poison_two(monkeypatch):
    """NaN in the last state of two batches' last samples (found by the writer's bit check)."""
    from eyrie.extract.hf import HFCapture

    real, calls = HFCapture.capture_pending, [0]

    def poisoned(self, sequences, host=None):
        pending = real(self, sequences, host)
        calls[0] += 1
        if calls[0] in (1, 3):
            pending.result()[-1][0].view(-1)[-1] = float("nan")
        return pending

    monkeypatch.setattr(HFCapture, "capture_pending", poisoned)
    return lambda: calls.__setitem__(0, 0)  # start counting again (the next run)


def test_process_writes_the_thread_writers_bytes_and_errors(setup, tmp_path, monkeypatch):
    again = poison_two(monkeypatch)
    runs = {}
    for mode in (False, True):
        again()
        out = tmp_path / f"process-{mode}"
        extract = {**EXTRACT, "writer_process": mode}
        runs[mode] = run(setup, out, extract=extract)
    same = [tmp_path / f"process-{m}" for m in (False, True)]
    assert file_hashes(same[0] / "shard-000.zarr") == file_hashes(same[1] / "shard-000.zarr")
    rows = [errors_rows(d / "shard-000.errors.csv") for d in same]
    assert rows[0] == rows[1]
    assert sum(r["reason"] == "non_finite" for r in rows[1]) == 2
    assert runs[True].samples == runs[False].samples > 0
    assert runs[True].seconds["writer_process_busy"] > 0
    assert "writer_process_busy" not in runs[False].seconds


def test_the_job_sends_each_group_before_it_waits_for_the_last_commit(setup, tmp_path, monkeypatch):
    """The writer process always has the next group in hand: when the job takes a commit's
    report, the group after it has been sent already (save for the last)."""
    in_hand = []
    real = WriterProcess.take_report

    def counting(self):
        in_hand.append(len(self._in_flight))
        return real(self)

    monkeypatch.setattr(WriterProcess, "take_report", counting)
    outcome = run(setup, tmp_path / "out", extract={**EXTRACT, "writer_process": True})
    assert outcome.samples > 0 and len(in_hand) >= 3
    assert in_hand[:-1] == [2] * (len(in_hand) - 1) and in_hand[-1] == 1


DRIVER = driver({**EXTRACT, "writer_process": True})


def writer_children(parent_pid: int) -> list[int]:
    """Live writer processes started by `parent_pid` (their command line names it)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"eyrie.store.remote_writer" in argv and str(parent_pid).encode() in argv:
            found.append(int(proc.name))
    return found


def holds_a_slab(pid: int) -> bool:
    """Whether process `pid` has one of the job's shared slabs mapped (eyrie/store/slabs.py)."""
    try:
        return "/memfd:eyrie-states" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_sigkill_of_the_job_ends_its_writer_and_resume_is_bit_exact(setup, tmp_path):
    """SIGKILL the job while its writer process is up: the writer dies with it (it never
    writes into a store whose lock is free), and the resumed store equals a clean run's.
    The writer is stopped first, so it cannot notice the job's end by itself."""

    def freeze_writer(proc) -> bool:
        # Frozen only once it holds a slab: it has served a group, so it asked for the
        # parent-death kill long before (a child frozen while still importing never asks,
        # and outlives any job; one that is not frozen checks its parent after asking).
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            children = writer_children(proc.pid)
            if children and all(map(holds_a_slab, children)):
                break
            time.sleep(0.01)
        else:
            return False  # the job ended first: no kill this time
        for child in children:  # frozen wherever it is, a commit half written maybe:
            os.kill(child, signal.SIGSTOP)  # only the kernel's parent-death kill ends it
        return True

    def writer_gone(proc) -> None:
        deadline = time.monotonic() + 10
        while writer_children(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not writer_children(proc.pid), "the writer process outlived its job"

    resumed, clean = kill_and_resume(
        setup,
        tmp_path,
        DRIVER,
        kills=2,
        seed=7,
        wait=(0.3, 1.5),
        ready=freeze_writer,
        killed=writer_gone,
    )
    assert file_hashes(resumed / "shard-000.zarr") == file_hashes(clean / "shard-000.zarr")
    assert errors_rows(resumed / "shard-000.errors.csv") == errors_rows(
        clean / "shard-000.errors.csv"
    )


# -- WriterProcess itself ---------------------------------------------------------------------

KW = {
    "hidden_size": 16,
    "aux_layer_ids": [0, 1],
    "provenance": {"test": 1},
    "chunk_tokens": 8,
    "shard_tokens": 32,
}


def sample(i: int, n: int = 5):
    return types.SimpleNamespace(
        line=i, sample_id=f"s{i}", input_ids=np.arange(n), loss_mask=np.ones(n)
    )


def open_process(path: Path, lock: StoreLock, groups, pool=None) -> WriterProcess:
    committed = ShardWriter(path, lock=lock, **KW)
    committed.close()
    child = WriterProcess(pool=pool)
    layouts = [layout(g, 2) for g in groups]
    child.open(path, lock, KW, committed=committed, layouts=layouts, slabs=2, cuda=False)
    return child


def captured(child: WriterProcess, group, seed: int):
    """Rows of `group` with random states living in a slab, laid out as the capture lays them
    (eyrie.extract.hf: one padded buffer per batch, rows are views of it)."""
    from eyrie.extract.job import batches

    slab = child.slab_for(layout(group, 2))
    rng = np.random.default_rng(seed)
    rows = {}
    for batch in batches(group, 2):
        t = max(len(group[i].input_ids) for i in batch)
        aux = slab.tensor((len(batch), t, 2, 16), torch.bfloat16)
        final = slab.tensor((len(batch), t, 16), torch.bfloat16)
        aux.copy_(torch.from_numpy(rng.standard_normal(tuple(aux.shape), dtype=np.float32)))
        final.copy_(torch.from_numpy(rng.standard_normal(tuple(final.shape), dtype=np.float32)))
        for r, i in enumerate(batch):
            g, n = group[i], len(group[i].input_ids)
            rows[i] = (g.line, g.sample_id, g.input_ids, g.loss_mask, aux[r, :n], final[r, :n])
    return slab, [rows[i] for i in range(len(group))]


def test_a_writer_error_comes_back_as_its_own_class(tmp_path):
    path = tmp_path / "s.zarr"
    lock = StoreLock(path).acquire()
    groups = [[sample(0), sample(1)], [sample(1), sample(2)]]
    child = open_process(path, lock, groups)
    try:
        report = child.store(*reversed(captured(child, groups[0], 0)))
        assert report["stored"] == [0, 1] and child.num_samples == 2
        with pytest.raises(StoreError, match="'s1' is already in this shard"):
            child.store(*reversed(captured(child, groups[1], 1)))
    finally:
        child.close()
        lock.release()
    with ShardWriter(path, **KW) as again:  # the failed group left nothing behind
        assert again.committed_ids == ["s0", "s1"]


def test_groups_sent_ahead_are_committed_in_order_and_reported_in_order(tmp_path):
    """The job sends the next group before it takes the last one's report (so the child never
    waits for the round trip): commits and reports keep the order of sending, a slab is not
    free before its report, and the next call that needs the reply stream waits for none."""
    path = tmp_path / "s.zarr"
    lock = StoreLock(path).acquire()
    groups = [[sample(0), sample(1)], [sample(2)], [sample(3), sample(4)]]
    child = open_process(path, lock, groups)
    child._max_slabs = 3
    try:
        sent = [captured(child, group, i) for i, group in enumerate(groups)]
        for slab, rows in sent:
            child.send_group(rows, slab)
        assert child._free == []  # every slab is with the child until its report
        with pytest.raises(StoreError, match="3 groups still unreported"):
            child.finish()
        reports = [child.take_report() for _ in groups]
        assert [r["stored"] for r in reports] == [[0, 1], [2], [3, 4]]
        assert len(child._free) == 3 and child.num_samples == 5
        child.finish()
    finally:
        child.close()
        lock.release()
    with ShardWriter(path, **KW) as again:
        assert again.committed_ids == ["s0", "s1", "s2", "s3", "s4"]


def test_the_slabs_are_made_when_the_store_opens_not_between_captures(tmp_path, monkeypatch):
    """open() makes every slab the planned groups will use (registering one with CUDA pins each
    page, work that would otherwise stand between two batches' forwards); the captures then
    only take them: no slab is made after open for groups that were planned. A pool the next
    writer process shares keeps them for it."""
    import eyrie.store.writer_process as write_process

    made, pool = [], SlabPool(keep=8)

    class CountedSlab(write_process.Slab):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(write_process, "Slab", CountedSlab)
    path = tmp_path / "s.zarr"
    lock = StoreLock(path).acquire()
    groups = [[sample(0), sample(1)], [sample(2)], [sample(3), sample(4, n=9)]]
    child = open_process(path, lock, groups, pool)  # at most 2 slabs (queue 0 + 2)
    try:
        assert len(made) == 2 and child._free == made and child.slab_seconds > 0
        planned = max(child.need(layout(g, 2)) for g in groups)
        assert all(slab.nbytes >= planned for slab in made)
        for i, group in enumerate(groups):
            slab, rows = captured(child, group, i)
            assert slab in made
            child.store(rows, slab)
        assert len(made) == 2 and child.num_samples == 5
        child.finish()
    finally:
        child.close()
        lock.release()
    one = tmp_path / "one.zarr"
    lock = StoreLock(one).acquire()
    child = open_process(one, lock, groups[:1], pool)  # one group: one slab, not the most allowed
    try:
        assert len(child._slabs) == 1 and child._slabs[0] in made  # kept by the first writer
        assert len(made) == 2
    finally:
        child.close()
        lock.release()


def test_a_group_larger_than_planned_gets_a_larger_slab(tmp_path):
    """Slabs are sized for the planned groups; a larger one replaces a free slab (the child
    lets go of the old one) and its samples are stored as any others."""
    path = tmp_path / "s.zarr"
    lock = StoreLock(path).acquire()
    small = [[sample(0)], [sample(1)]]
    child = open_process(path, lock, small)  # room for 2 slabs at once (queue 0 + 2)
    try:
        held = [captured(child, group, group[0].line) for group in small]  # both in use
        for slab, rows in held:
            child.store(rows, slab)
        large = [sample(3, n=400), sample(4, n=400)]
        slab, rows = captured(child, large, 3)
        assert slab.nbytes > max(s.nbytes for s, _ in held) and len(child._slabs) == 2
        assert child.store(rows, slab)["stored"] == [3, 4]
        child.finish()
    finally:
        child.close()
        lock.release()
    with ShardWriter(path, **KW) as again:
        assert again.committed_ids == ["s0", "s1", "s3", "s4"]
        assert again.num_tokens == 2 * 5 + 2 * 400


def test_a_killed_writer_is_an_error_naming_the_store(tmp_path):
    path = tmp_path / "s.zarr"
    lock = StoreLock(path).acquire()
    groups = [[sample(0)], [sample(1)]]
    child = open_process(path, lock, groups)
    try:
        child.store(*reversed(captured(child, groups[0], 0)))
        os.kill(child._proc.pid, signal.SIGKILL)
        with pytest.raises(WriterProcessError, match=r"killed by signal 9.*resumes") as info:
            child.store(*reversed(captured(child, groups[1], 1)))
        assert str(path) in str(info.value)
    finally:
        child.close()
        lock.release()
    with ShardWriter(path, **KW) as again:
        assert again.committed_ids == ["s0"]


def test_a_dead_writer_sent_a_new_slab_is_an_error_naming_the_store(tmp_path):
    """The child is gone when the next group brings a slab it has not seen: the descriptor
    cannot be sent, and that is the same error as a group that cannot be sent."""
    path = tmp_path / "s.zarr"
    lock = StoreLock(path).acquire()
    groups = [[sample(0)], [sample(1)]]
    child = open_process(path, lock, groups)
    try:
        first = captured(child, groups[0], 0)
        second = captured(child, groups[1], 1)  # both slabs in hand: the second is new
        assert first[0] is not second[0] and not second[0].announced
        child.store(*reversed(first))
        os.kill(child._proc.pid, signal.SIGKILL)
        child._proc.wait()
        with pytest.raises(WriterProcessError, match=r"killed by signal 9.*resumes") as info:
            child.store(*reversed(second))
        assert str(path) in str(info.value)
    finally:
        child.close()
        lock.release()


def test_the_setting_and_its_errors():
    assert use_writer_process("auto", "cpu", "hf") is False
    assert use_writer_process("auto", "cuda", "hf") is True
    assert use_writer_process("auto", "cuda", "sglang") is False
    assert use_writer_process(False, "cuda", "hf") is False
    assert use_writer_process(True, "cpu", "hf") is True
    with pytest.raises(ExtractError, match="writer_process: true needs capture.backend hf"):
        use_writer_process(True, "cuda", "sglang")


def test_a_full_disk_in_the_writer_is_still_a_full_disk():
    error = {"type": "OSError", "module": "builtins", "message": "", "traceback": ""}
    exc = rebuilt(
        {**error, "errno": errno.ENOSPC, "strerror": "No space", "filename": "x"}, Path("s")
    )
    assert isinstance(exc, OSError) and is_disk_full(exc) and exc.filename == "x"
    other = rebuilt({**error, "type": "KeyError", "errno": None}, Path("s"))
    assert isinstance(other, StoreError) and "writer process of s failed: KeyError" in str(other)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_process_and_thread_agree_and_gpu_finds_non_finite(tmp_path, monkeypatch):
    """On a GPU: the copy stream and the GPU's finite flags give the thread writer's bytes,
    and a NaN made by the model (a hook on a layer) is an error row in both modes."""
    root = tmp_path / "setup"
    target = build_llama(root / "target", layers=8)
    data = write_split(root / "train.jsonl", 24)
    import eyrie.extract.hf as hf

    real = hf.HFCapture.capture_pending
    calls = iter(range(1000))

    def with_nan(self, sequences, host=None):
        if next(calls) == 2:  # one batch: the last row's last real token gets a NaN
            n = len(sequences[-1])
            layer = hf.find_decoder_layers(self.model)[1][0]

            def hook(module, args, output):
                out = output[0] if isinstance(output, tuple) else output
                out[len(sequences) - 1, n - 1, 0] = float("nan")

            handle = layer.register_forward_hook(hook)
            try:
                return real(self, sequences, host)
            finally:
                handle.remove()
        return real(self, sequences, host)

    monkeypatch.setattr(hf.HFCapture, "capture_pending", with_nan)
    outs = []
    for mode in (False, True):
        calls = iter(range(1000))
        out = tmp_path / f"cuda-{mode}"
        capture = {**CAPTURE, "device": "cuda", "cuda_graphs": False}  # the hook: eager
        run((root, target, data), out, capture=capture, extract={**EXTRACT, "writer_process": mode})
        outs.append(out)
    assert file_hashes(outs[0] / "shard-000.zarr") == file_hashes(outs[1] / "shard-000.zarr")
    rows = [errors_rows(o / "shard-000.errors.csv") for o in outs]
    assert rows[0] == rows[1] and sum(r["reason"] == "non_finite" for r in rows[0]) == 1


def test_available_memory_reads_meminfo_and_a_cgroup_limit(tmp_path):
    from eyrie.store.slabs import available_memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100000000 kB\nMemAvailable:    8388608 kB\n")
    group = tmp_path / "cg" / "job_7" / "step_0"
    group.mkdir(parents=True)
    (group / "memory.max").write_text(f"{4 << 30}\n")
    (group / "memory.current").write_text(f"{1 << 30}\n")
    self_cgroup = tmp_path / "cgroup"
    self_cgroup.write_text("0::/job_7/step_0\n")
    args = {"meminfo": meminfo, "self_cgroup": self_cgroup, "cgroup_root": tmp_path / "cg"}
    assert available_memory(**args) == 3 << 30  # the job's limit leaves less than the node
    (group / "memory.max").write_text("max\n")
    assert available_memory(**args) == 8 << 30
    assert available_memory(meminfo=tmp_path / "none", self_cgroup=tmp_path / "none") is None


def test_slabs_larger_than_memory_left_fail_before_any_capture(setup, tmp_path, monkeypatch):
    """The job stops with the sizes and the fixes before it captures (slabs registered for
    the GPU's copies cannot be swapped: past the memory left the job would be killed)."""
    import eyrie.store.writer_process as write_process
    from eyrie.extract.hf import HFCapture

    captured = []
    monkeypatch.setattr(write_process, "available_memory", lambda: 4096)
    monkeypatch.setattr(HFCapture, "capture_pending", lambda *a, **k: captured.append(1))
    out = tmp_path / "small"
    with pytest.raises(StoreError) as info:
        run(setup, out, extract={**EXTRACT, "writer_process": True})
    message = str(info.value)
    assert "writer process needs up to" in message and "this job has 4.1 KB left" in message
    assert "dataset.max_tokens" in message and "--commit-every" in message
    assert captured == [] and not (out / "shard-000.zarr").exists()
    monkeypatch.undo()  # the machine's own memory: the rerun resumes and finishes
    assert run(setup, out, extract={**EXTRACT, "writer_process": True}).samples > 0
