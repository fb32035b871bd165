"""Tensor parallelism on the CPU: two ranks of the dump protocol over a real gloo group.

With `capture.sglang.tp` N, SGLang runs N scheduler processes, one per rank, and every one of
them runs the patch's hooks on its own copy of the hidden states. Each rank joins, per hooked
layer and pass, an all-gather of a per-row fingerprint over SGLang's tensor-parallel group;
only rank 0 stages its rows, copies them to the host and writes the files, and its writer
refuses a pass whose ranks disagree (a layer output that is still a partial sum).

Here two processes play the two ranks: each runs the transformers-backed stand-in server's
scheduler (tests/e2e/standin.py) with the bundle's hook factory, and the patch finds its rank
and group where it finds them in SGLang (`sglang.srt.distributed`), which each process fills
with a gloo group. What is not simulated: SGLang's own sharded kernels and its all-reduces
(proven on two H200s, benchmarks/RESULTS.md); here every rank computes the full states.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from tiny_target import build_llama

from eyrie.extract.dumps import DumpFolder, SglangError
from eyrie.sglang.patch import protocol as proto
from eyrie.sglang.patch.hooks import hook_specs
from eyrie.sglang.server import free_port

AUX = [1, 3, 4]
PREFIX = "eyrie-tp:"
PROMPTS = {f"{PREFIX}a": 10, f"{PREFIX}b": 40, f"{PREFIX}c": 7}  # b: three 16-token chunks
PARTIAL = f"{PREFIX}partial"  # rank 1 holds a partial sum of this request's layer outputs


def _fake_sglang(site: Path, rank: int, world: int, group) -> None:
    """An importable `sglang` package and the tensor-parallel API the patch asks of it."""
    pkg = site / "sglang"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text('__version__ = "0.0.tp"\n')
    sys.path.insert(0, str(site))
    import sglang  # noqa: F401  the patch reads its folder and version

    dist = types.ModuleType("sglang.srt.distributed")
    dist.get_tensor_model_parallel_world_size = lambda: world
    dist.get_tensor_model_parallel_rank = lambda: rank
    dist.get_tp_group = lambda: types.SimpleNamespace(device_group=group)
    sys.modules["sglang.srt.distributed"] = dist


def _rank(rank: int, world: int, port: int, work: str) -> None:
    """One tensor-parallel rank: the stand-in's scheduler with the patch's hooks."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from e2e.standin import StandIn

    from eyrie.sglang.patch import hooks

    work_dir = Path(work)
    _fake_sglang(work_dir / f"site{rank}", rank, world, torch.distributed.group.WORLD)
    specs = json.loads((work_dir / "specs.json").read_text())
    if rank == 1:  # rank 1's layer outputs before their all-reduce, for one request
        states = StandIn._states

        def halved(self, req):
            aux, final = states(self, req)
            return (aux * 0.5, final) if req.rid == PARTIAL else (aux, final)

        StandIn._states = halved
    standin = StandIn(work_dir / "target", specs, chunked_prefill_size=16)
    while standin.passes < 1:  # SGLang's ranks batch alike; the stand-in's warm-up must not
        time.sleep(0.01)  # join a pass on one rank only
    g = torch.Generator().manual_seed(0)
    prompts = [
        (rid, torch.randint(3, 200, (n,), generator=g).tolist()) for rid, n in PROMPTS.items()
    ]
    for rid, ids in [*prompts, (PARTIAL, prompts[0][1])]:  # one at a time: the same passes
        standin.generate(rid, ids)
    for dumper in hooks._DUMPERS.values():
        assert dumper.flush(timeout=30)
    standin.stop()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _serve_two_ranks(tmp_path: Path) -> DumpFolder:
    target = build_llama(tmp_path / "target")
    layers = [f"model.layers.{i}" for i in AUX]
    manifest = {
        "aux_layer_ids": AUX,
        "sglang": {"version": "0.0.tp", "files": {}},
        "rid_prefix": PREFIX,
        "mechanism": "forward_hooks",
        "hook_modules": {"start": "model.layers.0", "aux": layers, "final": "model.norm"},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    dump_dir = proto.ensure_private_dir(tmp_path / "dump")
    specs = hook_specs(manifest, str(tmp_path / "manifest.json"), str(dump_dir), PREFIX)
    for spec in specs:  # the bundle's factory, from Eyrie's package instead of the bundle's copy
        spec["hook_factory"] = "eyrie.sglang.patch.hooks:make_hook"
    (tmp_path / "specs.json").write_text(json.dumps(specs))
    assert target == tmp_path / "target"
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, str(tmp_path))) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    assert [p.exitcode for p in procs] == [0, 0]
    sha = proto.sha256_file(tmp_path / "manifest.json")
    return DumpFolder(dump_dir, sha, tmp_path)


def _reference(target: Path) -> dict:
    """rid -> (input ids, aux (T, k, H), final (T, H)) from a plain forward of the whole prompt."""
    from eyrie.extract.hf import HFCapture
    from eyrie.target.load import load_model

    model, _ = load_model(target, torch.device("cpu"))
    capture = HFCapture(model, AUX, pad_token_id=0)
    g = torch.Generator().manual_seed(0)
    out = {}
    for rid, n in PROMPTS.items():
        ids = torch.randint(3, 200, (n,), generator=g).numpy().astype(np.int64)
        ((aux, final),) = capture.capture([ids])
        out[rid] = (ids, aux, final)
    capture.close()
    return out


def test_two_ranks_only_rank_zero_writes_and_disagreeing_ranks_stop_the_request(tmp_path):
    folder = _serve_two_ranks(tmp_path)
    statuses = folder.statuses()
    assert sorted((s["tp_rank"], s["tp_size"]) for s in statuses) == [(0, 2), (1, 2)]
    rank0 = next(s["pid"] for s in statuses if s["tp_rank"] == 0)
    written = {s["tp_rank"]: s["timings"]["passes_written"] for s in statuses}
    assert written[1] == 0 and written[0] >= len(PROMPTS) + 3  # b came in three passes
    chunk_pids = set()
    for path in folder.path.glob(f"*{proto.CHUNK_SUFFIX}"):
        with safe_open(str(path), framework="pt") as f:
            chunk_pids.add(int(f.metadata()["pid"]))
            assert f.metadata()["tp_size"] == "2"
    assert chunk_pids == {rank0}
    reference = _reference(tmp_path / "target")
    for rid, (ids, aux, final) in reference.items():
        got_aux, got_final = folder.collect(rid, ids, timeout=5)
        assert torch.equal(got_aux, aux.to(got_aux.dtype)), rid
        assert torch.equal(got_final, final.to(got_final.dtype)), rid
    # the request whose states differ between the ranks: no file, an error naming the layer
    assert list(folder.path.glob(f"{proto.rid_key(PARTIAL)}*{proto.CHUNK_SUFFIX}")) == []
    with pytest.raises(SglangError, match="tp_disagree: aux layer 1 differs between"):
        folder.collect(PARTIAL, reference[f"{PREFIX}a"][0], timeout=5)
