"""The dump protocol, driven by recorded ForwardBatch-like passes (no SGLang, no GPU).

The passes below are written out the way SGLang's scheduler forms them: several requests per
EXTEND pass, a long prompt cut into chunks (extend_prefix_lens_cpu 0, then 4), a health check
and the warm-up request mixed in, and a decode pass. The states of each request are random
tensors; what the client reads back must equal them bit for bit.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from eyrie.extract.sglang import DumpFolder, SglangCapture, SglangError
from eyrie.sglang.patch import dump, hooks
from eyrie.sglang.patch import protocol as proto

AUX = [3, 1]  # deliberately not sorted: slot j is aux id AUX[j]
H = 8
PREFIX = "eyrie-t:"


class Mode:
    def __init__(self, extend: bool):
        self.extend = extend

    def is_extend(self) -> bool:
        return self.extend


@dataclass
class Batch:
    rids: list | None
    extend_seq_lens_cpu: list
    extend_prefix_lens_cpu: list
    positions: torch.Tensor
    input_ids: torch.Tensor
    forward_mode: Mode = field(default_factory=lambda: Mode(True))


def make_requests(seed: int = 0) -> dict:
    """rid -> (input ids (T,), aux states (T, k, H) in slot order, final (T, H)), bfloat16."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for rid, n in [
        (f"{PREFIX}a", 5),
        (f"{PREFIX}b", 3),
        (f"{PREFIX}c", 8),
        ("HEALTH_CHECK_1", 1),
        ("warmup-0", 2),
    ]:
        ids = torch.randint(0, 100, (n,), generator=g)
        aux = torch.randn(n, len(AUX), H, generator=g).to(torch.bfloat16)
        out[rid] = (ids, aux, torch.randn(n, H, generator=g).to(torch.bfloat16))
    return out


# (rid, prefix, length) per request, per pass: c arrives in two chunks.
PASSES = [
    [("HEALTH_CHECK_1", 0, 1), (f"{PREFIX}a", 0, 5), (f"{PREFIX}b", 0, 3)],
    [(f"{PREFIX}c", 0, 4), ("warmup-0", 0, 2)],
    [(f"{PREFIX}c", 4, 4)],
]


def make_batch(reqs: dict, spec: list, rids=True) -> tuple[Batch, torch.Tensor, torch.Tensor]:
    """A pass: the batch, and its aux (rows, k, H) and final (rows, H) tensors."""
    ids, pos, aux, final = [], [], [], []
    for rid, p, n in spec:
        r_ids, r_aux, r_final = reqs[rid]
        ids.append(r_ids[p : p + n])
        pos.append(torch.arange(p, p + n))
        aux.append(r_aux[p : p + n])
        final.append(r_final[p : p + n])
    batch = Batch(
        [s[0] for s in spec] if rids else None,
        [s[2] for s in spec],
        [s[1] for s in spec],
        torch.cat(pos),
        torch.cat(ids),
    )
    return batch, torch.cat(aux), torch.cat(final)


def split(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden, residual) whose sum is t exactly, each holding about half the values."""
    mask = torch.rand(t.shape, generator=torch.Generator().manual_seed(1)) < 0.5
    residual = torch.where(mask, t, torch.zeros_like(t))
    return t - residual, residual


def run_pass(d: dump.Dumper, batch, aux, final, skip_slot=None) -> None:
    d.start(batch)
    for slot in range(len(AUX)):
        if slot != skip_slot:
            d.aux(slot, batch, split(aux[:, slot]))
    d.final((final, torch.zeros_like(final)))


@pytest.fixture
def setup(tmp_path):
    manifest = {
        "aux_layer_ids": AUX,
        "sglang": {"version": "test", "files": {}},
        "rid_prefix": PREFIX,
        "mechanism": "forward_hooks",
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    settings = proto.load_settings(path, dump_dir=str(tmp_path / "dump"))
    folder = DumpFolder(tmp_path / "dump", settings.manifest_sha256, tmp_path)
    return settings, folder


def dumper(settings, tp=None) -> dump.Dumper:
    return dump.Dumper(settings, tp or dump.TensorParallel(), check=False)


def files(folder: DumpFolder, suffix: str) -> list[str]:
    return sorted(p.name for p in folder.path.iterdir() if p.name.endswith(suffix))


def test_a_flushed_dumper_leaves_its_status_file_alone_until_a_counter_moves(setup, monkeypatch):
    """The writer's idle refresh rewrites the status file only when a counter moved since it was
    written: after flush(), a host listing the folder finds no temporary of a late refresh."""
    settings, folder = setup
    monkeypatch.setattr(dump, "STATUS_EVERY_S", 3600.0)  # only flush() and the idle refresh
    d = dumper(settings)
    writes = []
    real = dump.write_json_atomic
    monkeypatch.setattr(dump, "write_json_atomic", lambda p, o: (writes.append(o), real(p, o)))
    reqs = make_requests()
    run_pass(d, *make_batch(reqs, PASSES[0]))
    assert d.flush(timeout=10)
    flushed = len(writes)
    time.sleep(1.5)  # three idle periods of the writer
    assert len(writes) == flushed
    run_pass(d, *make_batch(reqs, PASSES[1]))  # a pass: the idle writer refreshes on its own
    deadline = time.monotonic() + 10
    while len(writes) == flushed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert writes[-1]["passes"] == 2 and writes[-1]["timings"]["passes_written"] == 2


def test_chunked_passes_are_joined_and_other_requests_ignored(setup):
    settings, folder = setup
    reqs = make_requests()
    d = dumper(settings)
    for spec in PASSES:
        run_pass(d, *make_batch(reqs, spec))
    decode = Batch([f"{PREFIX}a"], [1], [5], torch.tensor([5]), torch.tensor([7]), Mode(False))
    d.start(decode)
    d.aux(0, decode, torch.ones(1, H))
    d.final(torch.ones(1, H))
    assert d.flush(timeout=10)  # the files are written by the dumper's own thread
    # a, b, and c in two chunks; nothing for the health check, the warm-up or the decode pass
    assert len(files(folder, proto.CHUNK_SUFFIX)) == 4
    assert files(folder, proto.ERROR_SUFFIX) == []
    c_key = proto.rid_key(f"{PREFIX}c")
    assert sorted(p.name for p in folder.path.glob(f"{c_key}.*")) == [
        proto.chunk_name(f"{PREFIX}c", 0),
        proto.chunk_name(f"{PREFIX}c", 4),
    ]
    for rid in (f"{PREFIX}a", f"{PREFIX}b", f"{PREFIX}c"):
        ids, aux, final = reqs[rid]
        got_aux, got_final = folder.collect(rid, ids.numpy(), timeout=1)
        assert got_aux.dtype == torch.bfloat16
        assert torch.equal(got_aux, aux) and torch.equal(got_final, final), rid
    assert files(folder, proto.CHUNK_SUFFIX) == []  # consumed and deleted
    assert folder.stats.chunked == 1 and folder.stats.max_chunks == 2
    status = folder.statuses()
    assert status[0]["tp_rank"] == 0 and status[0]["files_ok"] and status[0]["passes"] == 3
    written = status[0]["timings"]
    assert written["passes_written"] == 3 and written["bytes_written"] > 0


def fake_sglang(root, monkeypatch, version="9.9.9") -> dict:
    """A folder holding an importable `sglang` package; its files' sha256 as a manifest has them."""
    pkg = root / "site" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text(f'__version__ = "{version}"\n')
    monkeypatch.syspath_prepend(str(root / "site"))
    return {"sglang/version.py": proto.sha256_file(pkg / "version.py")}


def test_factory_hooks_feed_the_same_protocol(setup, tmp_path, monkeypatch):
    settings, folder = setup
    manifest = {
        **settings.manifest,
        "sglang": {"version": "9.9.9", "files": fake_sglang(tmp_path, monkeypatch)},
        "hook_modules": {"start": "m.layers.0", "aux": ["m.layers.3", "m.layers.1"], "final": "n"},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    folder.manifest_sha256 = proto.sha256_file(tmp_path / "manifest.json")
    specs = hooks.hook_specs(manifest, str(tmp_path / "manifest.json"), str(folder.path), PREFIX)
    assert [s["target_modules"] for s in specs] == [
        ["m.layers.0"],
        ["m.layers.3"],
        ["m.layers.1"],
        ["n"],
    ]
    assert all(s["hook_factory"] == "eyrie_sglang_patch.hooks:make_hook" for s in specs)
    made = [hooks.make_hook(s["config"]) for s in specs]
    reqs = make_requests(seed=3)
    for spec in PASSES:
        batch, aux, final = make_batch(reqs, spec)
        # a decoder layer's positional inputs: (positions, hidden_states, forward_batch, residual)
        made[0](None, (batch.positions, None, batch, None), split(aux[:, 0]))
        for slot in range(len(AUX)):
            out = (*split(aux[:, slot]), None)  # SGLang layers may return a third item
            made[1 + slot](None, (batch.positions, None, batch, None), out)
        made[-1](None, (final,), (final, torch.zeros_like(final)))
    ids, aux, final = reqs[f"{PREFIX}c"]
    got_aux, got_final = folder.collect(f"{PREFIX}c", ids.numpy(), timeout=1)
    assert torch.equal(got_aux, aux) and torch.equal(got_final, final)
    with pytest.raises(ValueError, match="role"):
        hooks.make_hook({**specs[0]["config"], "role": "middle"})
    with pytest.raises(ValueError, match="slot"):
        hooks.make_hook({**specs[1]["config"], "slot": 5})


def test_rank_other_than_zero_writes_nothing(setup):
    settings, folder = setup
    seen = []

    def gather(t):
        seen.append(t.shape)
        return [t, t.clone()]

    d = dumper(settings, dump.TensorParallel(rank=1, size=2, gather=gather))
    for spec in PASSES:
        run_pass(d, *make_batch(make_requests(), spec))
    assert files(folder, proto.CHUNK_SUFFIX) == [] and files(folder, proto.ERROR_SUFFIX) == []
    assert folder.statuses()[0]["tp_rank"] == 1
    assert len(seen) == 3 * (len(AUX) + 1)  # every rank joins the cross-rank check


def test_states_that_differ_between_ranks_are_an_error(setup):
    settings, folder = setup
    d = dumper(settings, dump.TensorParallel(0, 2, gather=lambda t: [t, t * 0.5 + 1]))
    reqs = make_requests()
    run_pass(d, *make_batch(reqs, PASSES[0]))
    assert files(folder, proto.CHUNK_SUFFIX) == []
    with pytest.raises(SglangError, match="tp_disagree.*tensor-parallel"):
        folder.collect(f"{PREFIX}a", reqs[f"{PREFIX}a"][0].numpy(), timeout=1)


def test_pending_all_reduce_is_an_error(setup):
    settings, folder = setup
    reqs = make_requests()
    batch, aux, final = make_batch(reqs, PASSES[0])
    d = dumper(settings)
    d.start(batch)
    hidden, residual = split(aux[:, 0])
    hidden._sglang_needs_allreduce_fusion = True  # what SGLang marks when it fused the all-reduce
    d.aux(0, batch, (hidden, residual))
    d.aux(1, batch, split(aux[:, 1]))
    d.final(final)
    with pytest.raises(SglangError, match="not_all_reduced.*enforce-disable-flashinfer"):
        folder.collect(f"{PREFIX}b", reqs[f"{PREFIX}b"][0].numpy(), timeout=1)


def test_radix_prefix_hit_and_gaps_are_errors(setup):
    settings, folder = setup
    reqs = make_requests()
    d = dumper(settings)
    run_pass(d, *make_batch(reqs, [(f"{PREFIX}c", 4, 4)]))  # its first pass starts at 4
    run_pass(d, *make_batch(reqs, [(f"{PREFIX}a", 0, 2)]))
    run_pass(d, *make_batch(reqs, [(f"{PREFIX}a", 3, 2)]))  # token 2 never came
    with pytest.raises(SglangError, match="radix_prefix_hit.*--disable-radix-cache"):
        folder.collect(f"{PREFIX}c", reqs[f"{PREFIX}c"][0].numpy(), timeout=1)
    with pytest.raises(SglangError, match="chunk_gap.*ended at 2"):
        folder.collect(f"{PREFIX}a", reqs[f"{PREFIX}a"][0].numpy(), timeout=1)


def test_a_hook_that_did_not_run_is_an_error(setup):
    settings, folder = setup
    reqs = make_requests()
    run_pass(dumper(settings), *make_batch(reqs, PASSES[0]), skip_slot=1)
    with pytest.raises(SglangError, match="missing_layers.*\\[1\\]"):
        folder.collect(f"{PREFIX}a", reqs[f"{PREFIX}a"][0].numpy(), timeout=1)


def test_batches_the_protocol_cannot_read_are_reported(setup):
    settings, folder = setup
    d = dumper(settings)
    reqs = make_requests()
    d.start(None)  # the ForwardBatch was passed by keyword: a hook cannot see it
    run_pass(d, *make_batch(reqs, PASSES[0], rids=False))  # a release without ForwardBatch.rids
    problems = folder.statuses()[0]["problems"]
    assert any("no ForwardBatch" in p for p in problems)
    assert any("carries no rids" in p and "import_hook" in p for p in problems)
    with pytest.raises(SglangError, match="hooks captured nothing.*carries no rids"):
        folder.collect(f"{PREFIX}a", reqs[f"{PREFIX}a"][0].numpy(), timeout=0.2)


def test_client_checks_what_the_server_computed(setup):
    settings, folder = setup
    reqs = make_requests()
    run_pass(dumper(settings), *make_batch(reqs, PASSES[0]))
    other = reqs[f"{PREFIX}a"][0].numpy().copy()
    other[2] += 1
    with pytest.raises(SglangError, match="other token ids.*token 2"):
        folder.collect(f"{PREFIX}a", other, timeout=1)
    with pytest.raises(SglangError, match="do not tile"):
        folder.collect(f"{PREFIX}b", np.zeros(2, dtype=np.int64), timeout=1)


def test_no_patch_and_no_dumps_are_told_apart(tmp_path):
    folder = DumpFolder(proto.ensure_private_dir(tmp_path / "d"), "x" * 64, tmp_path)
    with pytest.raises(SglangError, match="not loaded in it"):
        folder.collect(f"{PREFIX}a", np.arange(3), timeout=0.1)
    with pytest.raises(SglangError, match="not loaded"):
        folder.check_loaded("forward_hooks", PREFIX, wait_s=0.1)
    assert oct(folder.path.stat().st_mode & 0o777) == "0o700"


def test_release_mismatch_stops_the_server_side(tmp_path, monkeypatch):
    fake_sglang(tmp_path, monkeypatch)
    manifest = {
        "aux_layer_ids": AUX,
        "sglang": {"version": "9.9.9", "files": {"sglang/version.py": "0" * 64}},
        "rid_prefix": PREFIX,
    }
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    settings = proto.load_settings(tmp_path / "m.json", dump_dir=str(tmp_path / "dump"))
    with pytest.raises(RuntimeError, match="differs from the one verified.*version.py"):
        dump.Dumper(settings, dump.TensorParallel())
    status = DumpFolder(tmp_path / "dump", settings.manifest_sha256, tmp_path).statuses()
    assert status[0]["files_ok"] is False and status[0]["sglang_version"] == "9.9.9"


def test_requests_wait_while_the_dump_folder_is_full(setup):
    settings, folder = setup
    proto.ensure_private_dir(folder.path)
    big = folder.path / "leftover.bin"
    big.write_bytes(b"x" * 4096)
    conf = {"concurrency": 1, "request_timeout_s": 5, "dump_timeout_s": 1}
    conf.update(max_dump_bytes=1024, dtype="bfloat16")
    cap = SglangCapture("http://127.0.0.1:9", folder, conf, PREFIX)
    threading.Timer(0.3, big.unlink).start()
    t0 = time.monotonic()
    cap._room()
    assert 0.25 < time.monotonic() - t0 < 3 and folder.stats.waited_s > 0.25
    big.write_bytes(b"x" * 4096)
    time.sleep(0.1)  # the folder's size is scanned again at most every 50 ms
    cap.request_timeout = 0.2
    with pytest.raises(SglangError, match="max_dump_bytes"):
        cap._room()
    cap.close()


# ---------------------------------------------------------------------------------------------
# the hand-off: the forward's thread queues, a writer thread of the dumper's own writes


def test_chunk_files_are_what_safetensors_reads(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(0)
    tensors = {
        "aux": torch.randn(7, 3, 5, generator=g).to(torch.bfloat16),
        "final": torch.randn(5, 7, generator=g).t(),  # not contiguous, float32
        "input_ids": torch.randint(0, 1 << 40, (7,), generator=g),
        "half": torch.randn(7, 2, generator=g).to(torch.float16),
        "none": torch.zeros(0, 4, dtype=torch.bfloat16),
    }
    path = tmp_path / "c.safetensors"
    proto.save_chunk(path, tensors, {"rid": "eyrie-x:1", "tokens": 7})
    got = load_file(str(path))
    assert sorted(got) == sorted(tensors)
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"rid": "eyrie-x:1", "tokens": "7"}
    assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]  # no temporary left


def test_the_client_reads_what_safetensors_writes(tmp_path):
    from safetensors.torch import save_file

    from eyrie.extract.dumps import read_chunk

    g = torch.Generator().manual_seed(1)
    tensors = {
        "aux": torch.randn(9, 3, 5, generator=g).to(torch.bfloat16),
        "final": torch.randn(9, 5, generator=g),
        "input_ids": torch.randint(0, 1 << 40, (9,), generator=g),
        "none": torch.zeros(0, 5, dtype=torch.bfloat16),
    }
    save_file(tensors, str(tmp_path / "c.safetensors"), metadata={"rid": "r", "tokens": "9"})
    meta, got = read_chunk(tmp_path / "c.safetensors")
    assert meta == {"rid": "r", "tokens": "9"} and sorted(got) == sorted(tensors)
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    with pytest.raises(FileNotFoundError):
        read_chunk(tmp_path / "absent.safetensors")


@pytest.fixture
def held_writer(monkeypatch):
    """save_chunk made to wait until the returned event is set (a slow writer)."""
    release = threading.Event()
    real = dump.save_chunk

    def slow(*args, **kwargs):
        assert release.wait(10), "the test never released the writer"
        real(*args, **kwargs)

    monkeypatch.setattr(dump, "save_chunk", slow)
    return release


def test_the_forward_thread_only_queues_and_the_writer_keeps_its_own_copy(setup, held_writer):
    settings, folder = setup
    reqs = make_requests(seed=5)
    d = dumper(settings)
    # every row is ours: the hooks see SGLang's own tensors, not index_select's copies
    batch, aux, final = make_batch(reqs, [(f"{PREFIX}a", 0, 5), (f"{PREFIX}b", 0, 3)])
    outputs = [split(aux[:, slot]) for slot in range(len(AUX))]
    final_out = final.clone()
    d.start(batch)
    for slot, out in enumerate(outputs):
        d.aux(slot, batch, out)
    t0 = time.monotonic()
    d.final((final_out, torch.zeros_like(final_out)))
    assert time.monotonic() - t0 < 1 and files(folder, proto.CHUNK_SUFFIX) == []
    # SGLang reuses its buffers for the next pass: what the writer writes must not change
    for hidden, residual in outputs:
        hidden.add_(1)
        residual.mul_(-1)
    final_out.zero_()
    batch.input_ids.add_(1)
    batch.positions.add_(1)
    held_writer.set()
    assert d.flush(timeout=10)
    for rid in (f"{PREFIX}a", f"{PREFIX}b"):
        ids, want_aux, want_final = reqs[rid]
        got_aux, got_final = folder.collect(rid, ids.numpy(), timeout=1)
        assert torch.equal(got_aux, want_aux) and torch.equal(got_final, want_final), rid


def test_a_full_queue_holds_the_forward_back(setup, held_writer, monkeypatch):
    settings, folder = setup
    monkeypatch.setattr(dump, "QUEUE_PASSES", 1)
    reqs = make_requests(seed=6)
    d = dumper(settings)
    n = dump.WRITER_THREADS + 2  # one pass in each writer's hands, one queued, one waiting
    rids = [f"{PREFIX}q{i}" for i in range(n)]
    reqs.update({rid: reqs[f"{PREFIX}a"] for rid in rids})
    passes = [make_batch(reqs, [(rid, 0, 2)]) for rid in rids]
    runner = threading.Thread(target=lambda: [run_pass(d, *p) for p in passes], daemon=True)
    runner.start()
    runner.join(0.5)
    assert runner.is_alive() and files(folder, proto.CHUNK_SUFFIX) == []
    held_writer.set()
    runner.join(10)
    assert not runner.is_alive() and d.flush(timeout=10)
    assert len(files(folder, proto.CHUNK_SUFFIX)) == n
    assert d.timings.queue_wait_s > 0.3 and d.timings.passes_written == n


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_states_on_the_gpu_reach_the_files_unchanged(setup):
    settings, folder = setup
    reqs = make_requests(seed=7)
    d = dumper(settings)
    for spec in PASSES:
        batch, aux, final = make_batch(reqs, spec)
        batch.input_ids, batch.positions = batch.input_ids.cuda(), batch.positions.cuda()
        d.start(batch)
        for slot in range(len(AUX)):
            hidden, residual = split(aux[:, slot])
            d.aux(slot, batch, (hidden.cuda(), residual.cuda()))
        final_out = final.cuda()
        d.final((final_out, torch.zeros_like(final_out)))
        final_out.zero_()  # the next pass's work on the forward's stream
    assert d.flush(timeout=30)
    for rid in (f"{PREFIX}a", f"{PREFIX}b", f"{PREFIX}c"):
        ids, want_aux, want_final = reqs[rid]
        got_aux, got_final = folder.collect(rid, ids.numpy(), timeout=5)
        assert torch.equal(got_aux, want_aux) and torch.equal(got_final, want_final), rid


def test_a_waiting_request_is_woken_when_its_file_is_listed(tmp_path, monkeypatch):
    from eyrie.extract import dumps

    arrivals = dumps.Arrivals(tmp_path, tick_s=0.001)
    threading.Timer(0.2, (tmp_path / "b.safetensors").write_bytes, args=(b"x",)).start()
    t0 = time.monotonic()
    arrivals.wait(["a.safetensors", "b.safetensors"], timeout=5)
    assert 0.15 < time.monotonic() - t0 < 1.0  # woken by the listing, not by the timeout
    t0 = time.monotonic()
    arrivals.wait(["c.safetensors"], timeout=0.1)  # never comes: the timeout bounds the wait
    assert 0.08 < time.monotonic() - t0 < 1.0
    # a lister that dies is replaced by the next waiter's
    real, calls = os.listdir, []

    def broken(path):
        calls.append(path)
        if len(calls) == 1:
            raise RuntimeError("listing failed")
        return real(path)

    monkeypatch.setattr(dumps.os, "listdir", broken)
    arrivals.wait(["b.safetensors"], timeout=0.2)  # the first lister dies here
    time.sleep(0.05)
    t0 = time.monotonic()
    arrivals.wait(["b.safetensors"], timeout=5)
    assert time.monotonic() - t0 < 1.0 and len(calls) >= 2


def test_an_exiting_process_writes_the_passes_it_handed_over(tmp_path):
    """The writer's threads are daemons: without the exit's wait, a process that ends right
    after a pass (an orderly server exit) would lose that pass's files, or abort while a
    writer is inside torch."""
    import subprocess
    import sys

    script = f"""
import time, torch
from pathlib import Path
from eyrie.sglang.patch.handoff import HostCopy, PassWriter, Timings

def write(item):
    time.sleep(0.5)  # a slow disk: still writing when the main thread ends
    Path({str(tmp_path / "pass.txt")!r}).write_text(str(int(item.aux.sum())))

item = HostCopy().to_host(torch.ones(3, 1, 2), torch.ones(3, 2), None, None)
item.write = write
PassWriter(Timings()).put(item)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pass.txt").read_text() == "6"
