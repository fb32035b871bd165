"""The capture loop alone against a bare forward of the same batches: what capturing costs.

No store and no writer: `HFCapture.capture_pending` on every batch extraction would run (same
samples, same padding, same order), its states landing either in torch's pinned memory (the
writer thread's path) or in one shared slab registered with CUDA (the writer process's path,
eyrie/store/slabs.py; registered before the timed loop, as the job registers its slabs when
the store opens). At most 8 batches stay pending, as in a commit group. The baseline is the
decoder without lm_head (extraction never computes it). Repeats alternate; each line prints
the times and the ratios.

Each loop runs with the 2-D mask transformers turns into a 4-D one (reading it on the host,
which makes the host wait for the GPU at every batch) or with the 4-D mask built on the GPU
(HFCapture's mask_4d); the count of the host's waits per batch is printed first.

A fourth loop is the extraction's own arrangement without its writer: three slabs used in turn,
each commit group's copies awaited on a second thread (as the writer's thread awaits them), and
a slab reused only once that thread has let go of it. Where it is slower than the slab loop
above, the cost is in waiting beside the forward, not in the capture itself.

    python benchmarks/bench_capture.py                          # toy-llama, CPU
    python benchmarks/bench_capture.py --device cuda --samples 1536
"""

from __future__ import annotations

import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from bench_extract import (
    bare_forward,
    build_realistic,
    extraction_batches,
    split_file,
    target_dir,
    workload_args,
)
from common import machine

from eyrie.data.split import read_split
from eyrie.extract.hf import HFCapture, padded_batch
from eyrie.extract.tokens import tokenize
from eyrie.store.slabs import Slab, aligned
from eyrie.target.layers import resolve_aux_layer_ids
from eyrie.target.load import load_target, resolve_device


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def batch_need(batch, per_token: int, k: int) -> int:
    """Slab bytes of one padded batch's states: aux (k layers) and final, each aligned."""
    padded = len(batch) * max(map(len, batch)) * per_token
    return aligned(padded * k) + aligned(padded)


def capture_loop(target, batches, aux_ids, host: str, mask_4d: bool = False) -> float:
    pad = target.tokenizer.pad_token_id or 0
    cap = HFCapture(target.model, aux_ids, pad_token_id=pad, mask_4d=mask_4d)
    slab = None
    if host == "slab":  # room for 8 batches' states (aux and final, bf16, padded)
        per_token = 2 * target_hidden(target)
        need = [batch_need(b, per_token, len(aux_ids)) for b in batches]
        slab = Slab(max(sum(need[i : i + 8]) for i in range(0, len(need), 8)))
        if target.device.type == "cuda":  # as the job does, before its first capture
            slab.register_cuda()
    sync()
    start = time.perf_counter()
    pending = []
    for i, batch in enumerate(batches):
        if slab is not None and i % 8 == 0:
            for p in pending:  # the slab is reused: what it holds must have landed
                p.result()
            pending = []
            slab.reset()
        pending.append(cap.capture_pending(batch, slab.tensor if slab is not None else None))
        if len(pending) > 8:
            pending.pop(0).result()
    for p in pending:
        p.result()
    sync()
    elapsed = time.perf_counter() - start
    cap.close()
    if slab is not None:
        slab.close()
    return elapsed


def on_device_loop(target, batches, aux_ids) -> float:
    """The capture's forward, stack and finite flags with the states left on the GPU: no
    copies to the host. Where the loops above are slower than this, the copies cost it."""
    pad = target.tokenizer.pad_token_id or 0
    cap = HFCapture(target.model, aux_ids, pad_token_id=pad)
    device = target.device
    sync()
    start = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            ids, mask = padded_batch(batch, pad)
            cap._states(ids.pin_memory(), mask.pin_memory(), device, True)
    sync()
    elapsed = time.perf_counter() - start
    cap.close()
    return elapsed


def syncs_of(run) -> int:
    """How many times `run()` made the host wait for the GPU (torch's sync debug mode)."""
    if not torch.cuda.is_available():
        return 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen)


def pipeline_loop(target, batches, aux_ids, slabs: int = 3) -> float:
    """Capture into `slabs` slabs in turn; a second thread awaits each group's copies."""
    import queue
    import threading

    cap = HFCapture(target.model, aux_ids, pad_token_id=target.tokenizer.pad_token_id or 0)
    per_token = 2 * target_hidden(target)
    groups = [batches[i : i + 8] for i in range(0, len(batches), 8)]
    need = max(sum(batch_need(b, per_token, len(aux_ids)) for b in g) for g in groups)
    pool = [Slab(need) for _ in range(slabs)]
    free = [threading.Event() for _ in pool]
    todo: queue.Queue = queue.Queue()

    def waiter():
        while (item := todo.get()) is not None:
            k, pending = item
            for p in pending:
                p.result()
            free[k].set()

    if target.device.type == "cuda":  # as the job does, when its store opens
        for slab in pool:
            slab.register_cuda()
    sync()
    start = time.perf_counter()
    for f in free:
        f.set()
    thread = threading.Thread(target=waiter)
    thread.start()
    for i, group in enumerate(groups):
        k = i % slabs
        free[k].wait()
        free[k].clear()
        pool[k].reset()
        todo.put((k, [cap.capture_pending(b, pool[k].tensor) for b in group]))
    todo.put(None)
    thread.join()
    sync()
    elapsed = time.perf_counter() - start
    cap.close()
    for slab in pool:
        slab.close()
    return elapsed


def target_hidden(target) -> int:
    return int(target.model.config.get_text_config().hidden_size)


def main(argv=None) -> int:
    ap = workload_args(__doc__.splitlines()[0], samples=256)
    ap.add_argument(
        "--width",
        default="toy",
        choices=["toy", "realistic"],
        help="realistic: a random Llama of Llama-3-8B's layer shape (bench_extract's)",
    )
    ap.add_argument("--layers", type=int, default=8, help="layers of the realistic model")
    args = ap.parse_args(argv)
    print(f"machine:  {machine(resolve_device(args.device).type)}")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.width == "toy":
            path = target_dir(args.target, tmp)
        else:
            path = build_realistic(tmp / "llama-4096", args.layers, args.device)
        target = load_target(path, device=args.device)
        split = read_split(split_file(args.data, args.samples, tmp))
        good, _ = tokenize(target.tokenizer, split, args.max_tokens)
        batches = extraction_batches(good, 64, args.batch_size)
        layers = target.model.config.get_text_config().num_hidden_layers
        aux_ids = resolve_aux_layer_ids(None, layers)  # extraction's default
        base = target.model.get_decoder()
        pad = target.tokenizer.pad_token_id or 0
        bare_forward(base, batches, pad, target.device)  # every shape once (a first is slow)
        capture_loop(target, batches[:16], aux_ids, "pinned")
        tokens = sum(len(g.input_ids) for g in good)
        print(f"{len(batches)} batches, {tokens} tokens, aux layers {aux_ids}")
        one = batches[:1]
        print(
            "host waits for the GPU in one batch: bare forward, 2-D mask "
            f"{syncs_of(lambda: bare_forward(base, one, pad, target.device, pinned=True))}; "
            "4-D mask "
            f"{syncs_of(lambda: bare_forward(base, one, pad, target.device, pinned=True, mask_4d=True))}; "  # noqa: E501
            "capture, 2-D mask "
            f"{syncs_of(lambda: capture_loop(target, one, aux_ids, 'slab'))}; "
            "4-D mask "
            f"{syncs_of(lambda: capture_loop(target, one, aux_ids, 'slab', mask_4d=True))} "
            "(a capture's count includes its wait for its own copies, where torch counts it)"
        )
        for r in range(args.repeats):
            bare = bare_forward(base, batches, pad, target.device)
            bare4 = bare_forward(base, batches, pad, target.device, pinned=True, mask_4d=True)
            pinned = capture_loop(target, batches, aux_ids, "pinned")
            slab = capture_loop(target, batches, aux_ids, "slab")
            slab4 = capture_loop(target, batches, aux_ids, "slab", mask_4d=True)
            piped = pipeline_loop(target, batches, aux_ids)
            kept = on_device_loop(target, batches, aux_ids) if target.device.type == "cuda" else 0
            print(
                f"repeat {r} (ended {time.strftime('%H:%M:%S')}): bare forward (no lm_head) "
                f"{bare:.3f} s | the same, pinned inputs "
                f"and the 4-D mask {bare4:.3f} s ({bare4 / bare:.3f}x) | capture, pinned "
                f"{pinned:.3f} s ({pinned / bare:.3f}x) | capture, shared slab {slab:.3f} s "
                f"({slab / bare:.3f}x) | the same, 4-D mask {slab4:.3f} s ({slab4 / bare:.3f}x, "
                f"{slab4 / bare4:.3f}x the 4-D bare) | 3 slabs, awaited on a thread, the "
                f"job's mask {piped:.3f} s ({piped / bare:.3f}x, {piped / bare4:.3f}x)"
                + (f" | states left on the GPU {kept:.3f} s ({kept / bare:.3f}x)" if kept else "")
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
