"""The capture's forward pass as CUDA graphs: one graph per bucket of lengths, replayed.

Why: a small or shallow target's forward is bound by the one Python thread that launches its
kernels, not by the GPU. On the H200 the toy's forward replayed as graphs took a fraction of
the eager forward's time, and steadily (benchmarks/RESULTS.md, "The capture's forward as CUDA
graphs"): the host's drift was all in the launches. A graph
replays a whole forward, the aux states' stacking and the finite flags included, as one launch.

Graphs need fixed shapes. Each batch is right-padded to a multiple of `bucket_tokens` tokens and
to the full batch size (rows that pad the batch see one token, so no row is all masked); one
graph per bucket is captured the first time the bucket is seen. The mask goes in as the 4-D
boolean mask (causal and padding) that transformers gives SDPA, built inside the graph from the
2-D one, since transformers' own mask code reads values on the host, which a capture forbids.
All graphs share one memory pool: each replay's outputs are cloned on the replay's stream
before the next replay, so no graph overwrites states not yet taken.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from eyrie.common.errors import EyrieError

log = logging.getLogger("eyrie.extract.graphs")

GRAPH_ATTENTION = ("sdpa", "eager")  # implementations that take a 4-D mask as it is
# capture.cuda_graphs auto: only targets this small are launch-bound, so only they gain from
# graphs; a larger forward keeps the GPU busy anyway, and the buckets' padding is more work
# (benchmarks/RESULTS.md, "The capture's forward as CUDA graphs").
GRAPHS_AUTO_MAX_PARAMS = 1_000_000_000


class GraphCaptureFailed(RuntimeError):
    """A graph of the forward could not be captured (an operation graphs do not allow, memory)."""


def bucket_of(length: int, bucket_tokens: int) -> int:
    """`length` rounded up to a multiple of `bucket_tokens`."""
    return -(-length // bucket_tokens) * bucket_tokens


def attention_mask_4d(mask: torch.Tensor, additive_dtype: torch.dtype | None = None):
    """(B, 1, T, T) causal-and-padding mask from a (B, T) 0/1 mask: boolean (True = attend), or
    additive (0 or the dtype's minimum) for transformers' eager attention."""
    t = mask.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=mask.device).tril()
    keep = causal[None, None] & mask[:, None, None, :].bool()
    if additive_dtype is None:
        return keep
    blocked = torch.zeros(keep.shape, dtype=additive_dtype, device=mask.device)
    return blocked.masked_fill(~keep, torch.finfo(additive_dtype).min)


def too_large_for_auto(model: torch.nn.Module) -> str | None:
    """Why capture.cuda_graphs auto leaves a target eager (it is not launch-bound), or None."""
    params = sum(p.numel() for p in model.parameters())
    if params > GRAPHS_AUTO_MAX_PARAMS:
        return (
            f"{params / 1e9:.1f} B parameters: a forward this large keeps the GPU busy without "
            "graphs (auto uses them up to 1 B; true forces them)"
        )
    return None


def why_not_graphs(model: torch.nn.Module, device: torch.device) -> str | None:
    """None when the capture's forward can run as graphs here, else why not."""
    if device.type != "cuda":
        return f"the target runs on {device.type}, not CUDA"
    if not hasattr(model, "get_decoder"):
        return f"{type(model).__name__} has no get_decoder() (the model without its lm_head)"
    attention = getattr(model.config, "_attn_implementation", None)
    if attention not in GRAPH_ATTENTION:
        return f"attention implementation {attention!r} takes no 4-D mask (needs sdpa or eager)"
    return None


class GraphForward:
    """`body(ids, mask)` over (batch_size, bucket) shapes: replayed graphs on CUDA, run
    eagerly elsewhere (which checks the bucketed form on a CPU).

    `body` takes static ids and a 2-D mask, both (batch_size, T), and returns tensors whose
    first two dimensions are (batch_size, T) or whose first is batch_size; `run` gives them
    cut to the batch's real rows and longest length.
    """

    def __init__(
        self,
        body: Callable[[torch.Tensor, torch.Tensor], tuple],
        *,
        batch_size: int,
        bucket_tokens: int,
        pad_token_id: int,
        device: torch.device,
    ):
        self.body, self.batch_size, self.bucket_tokens = body, int(batch_size), int(bucket_tokens)
        self.pad_token_id, self.device = int(pad_token_id), device
        self.graphs: dict[int, tuple] = {}  # bucket -> (graph, static ids, static mask, outputs)
        self.capture_s = 0.0  # seconds spent capturing graphs (their warm-up included)
        self._pool = None

    def _graph_for(self, width: int) -> tuple:
        if width in self.graphs:
            return self.graphs[width]
        tick = time.perf_counter()
        ids = torch.full((self.batch_size, width), self.pad_token_id, device=self.device)
        mask = torch.ones_like(ids)
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-up off the capture, as torch.cuda.graph asks
            self.body(ids, mask)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = self.body(ids, mask)
        except EyrieError:  # the body's own checks (a hook that did not fire): not graphs'
            raise
        except Exception as exc:
            raise GraphCaptureFailed(
                f"capturing a CUDA graph of the forward over {self.batch_size} x {width} "
                f"tokens failed ({type(exc).__name__}: {exc})"
            ) from exc
        self.graphs[width] = (graph, ids, mask, outputs)
        self.capture_s += time.perf_counter() - tick
        log.debug("CUDA graph for %d x %d tokens captured", self.batch_size, width)
        return self.graphs[width]

    def run(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple:
        """The body's outputs for host tensors ids and mask (B, T), B <= batch_size."""
        rows, length = ids.shape
        if rows > self.batch_size:
            raise ValueError(f"a batch of {rows} rows; the graphs hold {self.batch_size}")
        width = bucket_of(length, self.bucket_tokens)
        full_ids = torch.full((self.batch_size, width), self.pad_token_id, dtype=torch.long)
        full_mask = torch.zeros_like(full_ids)
        full_ids[:rows, :length], full_mask[:rows, :length] = ids, mask
        full_mask[rows:, 0] = 1  # rows that pad the batch attend to one token
        if self.device.type != "cuda":
            outputs = self.body(full_ids.to(self.device), full_mask.to(self.device))
        else:
            graph, static_ids, static_mask, outputs = self._graph_for(width)
            static_ids.copy_(full_ids.pin_memory(), non_blocking=True)
            static_mask.copy_(full_mask.pin_memory(), non_blocking=True)
            graph.replay()
        # clones on this stream: the next replay (any graph: one pool) cannot overwrite them
        return tuple(None if o is None else _cut(o, rows, length, width).clone() for o in outputs)


def _cut(out: torch.Tensor, rows: int, length: int, width: int) -> torch.Tensor:
    """A bucketed output's real rows, and its real tokens when it has a token dimension."""
    return out[:rows, :length] if out.dim() >= 2 and out.shape[1] == width else out[:rows]
