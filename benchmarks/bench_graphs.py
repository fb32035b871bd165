"""What CUDA graphs would take off extraction's forward thread: the toy's capture, replayed.

The toy's forward is bound by one Python thread launching its kernels (benchmarks/RESULTS.md,
"Pairs a few seconds apart ..."): the capture loop alone costs 1.1-1.3x a bare forward, and the
bare forward itself is mostly launches. A CUDA graph replays a whole forward, hooks, stacking and
finite flags included, as one launch. Graphs need fixed shapes, so each batch is padded to a
bucket of `--bucket` tokens (and to the full batch size); one graph per bucket, captured once.
The mask goes in as the 4-D boolean mask transformers passes to SDPA as it is (causal and
padding), built inside the graph from the 2-D one.

Loops, alternating in one process, every batch extraction would run (same samples, same order):

- bare forward, eager (the decoder without lm_head, as bench_extract.py's baseline), and the same
  fed from pinned memory;
- eager capture (eyrie.extract.hf.HFCapture.capture_pending into torch's pinned buffers);
- bare forward, graphs (the decoder only, bucketed): the fair baseline for graphs;
- capture, graphs: the decoder with the aux layers' outputs stacked, the final state and the
  per-row finite flags inside the graph, then copied to pinned buffers as the eager capture does.

It also checks the graphs' states against the eager capture's on the real tokens: how many
values differ, and by how many bf16 steps at most (bucketing changes shapes and the mask's form,
so kernels may differ in their last bits). Needs CUDA for the graphs; on the CPU it runs the
bucketed forward eagerly, which checks the 4-D mask against transformers' own 2-D path.

    python benchmarks/bench_graphs.py --device cuda --samples 1536
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests")]

import bench_extract as bench  # noqa: E402
from bench_capture import capture_loop, sync  # noqa: E402

from eyrie.extract.hf import HFCapture  # noqa: E402
from eyrie.extract.split import read_split, resolve_aux_layer_ids, tokenize  # noqa: E402
from eyrie.target.load import load_target, resolve_device  # noqa: E402


def bucket_of(length: int, bucket: int) -> int:
    return -(-length // bucket) * bucket


class Bucketed:
    """The decoder over fixed (batch, bucket) shapes, with or without the capture's work."""

    def __init__(self, decoder, aux_ids, batch: int, bucket: int, capture: bool, pad_id: int):
        self.decoder, self.aux_ids, self.batch, self.bucket = decoder, list(aux_ids), batch, bucket
        self.capture, self.pad_id = capture, pad_id
        # sdpa takes the boolean mask as it is; the eager attention adds it to the scores
        self.additive = decoder.config._attn_implementation == "eager"
        self.device = next(decoder.parameters()).device
        self._seen: dict[int, torch.Tensor] = {}
        self.graphs: dict[int, tuple] = {}  # bucket -> (graph, ids, mask, outputs)

    def _hook(self, slot: int):
        def hook(module, args, output):
            self._seen[slot] = output[0] if isinstance(output, tuple) else output

        return hook

    def run(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple:
        """One forward over static-shaped ids and 2-D mask (B, T): the states and flags."""
        t = ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        keep = causal[None, None] & mask[:, None, None, :].bool()
        if self.additive:
            dtype = next(self.decoder.parameters()).dtype
            keep = torch.zeros(keep.shape, dtype=dtype, device=ids.device).masked_fill(
                ~keep, torch.finfo(dtype).min
            )
        # hooks only while this forward runs (on CUDA: while its graph is captured), so the
        # eager loops timed beside it pay nothing for them
        layers = self.decoder.layers
        hooks = (
            [layers[i].register_forward_hook(self._hook(j)) for j, i in enumerate(self.aux_ids)]
            if self.capture
            else []
        )
        try:
            out = self.decoder(input_ids=ids, attention_mask=keep, use_cache=False)
        finally:
            for h in hooks:
                h.remove()
        final = out.last_hidden_state
        if not self.capture:
            return (final,)
        stacked = torch.stack([self._seen[s] for s in range(len(self.aux_ids))], dim=2)
        stacked, final = stacked.to(torch.bfloat16), final.to(torch.bfloat16)  # as stored
        ok = torch.isfinite(stacked).flatten(2).all(-1) & torch.isfinite(final).all(-1)
        finite = (ok | (mask == 0)).all(-1)
        return stacked, final, finite

    def inputs(self, seqs) -> tuple[torch.Tensor, torch.Tensor, int]:
        t = bucket_of(max(map(len, seqs)), self.bucket)
        ids, mask = bench.padded_batch(seqs, self.pad_id, rows=self.batch, width=t)
        mask[len(seqs) :, 0] = 1  # rows that pad the batch see one token: no row is all masked
        return ids, mask, t

    def graph_for(self, t: int) -> tuple:
        if t not in self.graphs:
            ids = torch.full((self.batch, t), self.pad_id, dtype=torch.long, device=self.device)
            mask = torch.ones_like(ids)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):  # warm-up, as torch.cuda.graph asks
                    self.run(ids, mask)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # a pool of its own: replays come in any order
                outputs = self.run(ids, mask)
            self.graphs[t] = (graph, ids, mask, outputs)
        return self.graphs[t]

    def step(self, seqs, keep: bool = False):
        """One batch: graph replay on CUDA (eager elsewhere); the states copied to pinned
        host buffers without waiting when capturing. keep: return them (the check)."""
        ids, mask, t = self.inputs(seqs)
        cuda = self.device.type == "cuda"
        if cuda:
            graph, s_ids, s_mask, outputs = self.graph_for(t)
            s_ids.copy_(ids.pin_memory(), non_blocking=True)
            s_mask.copy_(mask.pin_memory(), non_blocking=True)
            graph.replay()
        else:
            outputs = self.run(ids.to(self.device), mask.to(self.device))
        if not self.capture:
            return None
        # on the replay's stream: the next replay of this bucket cannot overwrite them first
        host = [torch.empty(o.shape, dtype=o.dtype, pin_memory=cuda) for o in outputs]
        for dst, src in zip(host, outputs, strict=True):
            dst.copy_(src, non_blocking=cuda)
        return host if keep else None


def bucketed_loop(runner: Bucketed, batches) -> float:
    sync()
    start = time.perf_counter()
    with torch.inference_mode():
        for seqs in batches:
            runner.step(seqs)
    sync()
    return time.perf_counter() - start


def ordered_bits(x: torch.Tensor) -> np.ndarray:
    """bf16 values as integers in their order: neighbours differ by 1 (one step of bf16)."""
    u = x.contiguous().view(torch.int16).numpy().astype(np.int32) & 0xFFFF
    return np.where(u < 0x8000, u, 0x8000 - u)


def largest_difference(target, aux_ids, runner: Bucketed, batches, pad: int) -> tuple:
    """Over the real tokens of 8 batches: (elements differing, elements, largest difference in
    bf16 steps, largest |difference| over the state's largest |value|) between the graphs'
    states and the eager capture's (steps alone overstate differences near zero)."""
    cap = HFCapture(target.model, aux_ids, pad_token_id=pad)
    with torch.inference_mode():
        eager_rows = [cap.capture(seqs) for seqs in batches[:8]]
    cap.close()  # its final-norm hook ends a forward: not while the runner runs
    differing, total, steps, scaled = 0, 0, 0, 0.0
    with torch.inference_mode():
        for seqs, eager in zip(batches[:8], eager_rows, strict=True):
            got = runner.step(seqs, keep=True)
            sync()
            for r, (aux, fin) in enumerate(eager):
                n = len(seqs[r])
                for mine, theirs in ((got[0][r, :n], aux), (got[1][r, :n], fin)):
                    gap = np.abs(ordered_bits(mine) - ordered_bits(theirs))
                    differing += int((gap > 0).sum())
                    total += gap.size
                    steps = max(steps, int(gap.max()))
                    size = theirs.float().abs().max().clamp_min(1e-30)
                    scaled = max(scaled, float((mine.float() - theirs.float()).abs().max() / size))
    return differing, total, steps, scaled


def main(argv=None) -> int:
    ap = bench.workload_args(__doc__.splitlines()[0], samples=1536)
    ap.add_argument("--bucket", type=int, default=64, help="tokens a batch is padded up to")
    args = ap.parse_args(argv)
    print(f"machine:  {bench.machine(resolve_device(args.device).type)}")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        target = load_target(bench.target_dir(args.target, tmp), device=args.device)
        good, _ = tokenize(
            target.tokenizer,
            read_split(bench.split_file(args.data, args.samples, tmp)),
            args.max_tokens,
        )
        batches = bench.extraction_batches(good, 64, args.batch_size)
        layers = target.model.config.get_text_config().num_hidden_layers
        aux_ids = resolve_aux_layer_ids(None, layers)
        decoder, pad = target.model.get_decoder(), target.tokenizer.pad_token_id or 0
        runners = {
            kind: Bucketed(decoder, aux_ids, args.batch_size, args.bucket, kind == "capture", pad)
            for kind in ("bare", "capture")
        }
        tokens = sum(len(g.input_ids) for g in good)
        padded = sum(args.batch_size * bucket_of(max(map(len, b)), args.bucket) for b in batches)
        print(
            f"{len(batches)} batches, {tokens} tokens ({padded} with the buckets' padding), "
            f"aux layers {aux_ids}, buckets of {args.bucket} tokens"
        )
        start = time.perf_counter()  # every shape once: eager's first pass, the graphs' capture
        bench.bare_forward(decoder, batches, pad, target.device)
        capture_loop(target, batches, aux_ids, "pinned")
        for runner in runners.values():
            bucketed_loop(runner, batches)
        print(f"warm-up and graph capture: {time.perf_counter() - start:.1f} s")
        differing, total, steps, scaled = largest_difference(
            target, aux_ids, runners["capture"], batches, pad
        )
        print(
            f"graphs vs eager capture, real tokens of 8 batches: {differing} of {total} values "
            f"differ, by at most {steps} bf16 steps and {scaled:.1e} of the state's largest |value|"
        )
        rows, device = [], target.device
        for r in range(args.repeats):
            times = {
                "bare": bench.bare_forward(decoder, batches, pad, device),
                "bare_pinned": bench.bare_forward(decoder, batches, pad, device, pinned=True),
                "capture": capture_loop(target, batches, aux_ids, "pinned"),
                "graph_bare": bucketed_loop(runners["bare"], batches),
                "graph_capture": bucketed_loop(runners["capture"], batches),
            }
            rows.append(times)
            print(
                f"repeat {r}: "
                + " | ".join(f"{k} {v:.3f} s" for k, v in times.items())
                + f" | graph capture / bare {times['graph_capture'] / times['bare']:.3f}x, "
                f"/ bare pinned {times['graph_capture'] / times['bare_pinned']:.3f}x, "
                f"/ graph bare {times['graph_capture'] / times['graph_bare']:.3f}x; eager "
                f"capture / bare pinned {times['capture'] / times['bare_pinned']:.3f}x",
                flush=True,
            )
        med = {k: statistics.median(t[k] for t in rows) for k in rows[0]}
        print(
            "median: "
            + " | ".join(f"{k} {v:.3f} s ({tokens / v:.0f} tok/s)" for k, v in med.items())
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
