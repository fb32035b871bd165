"""What the hooks read of SGLang's forward pass: our requests' rows, chunk order, TP ranks.

Runs inside the server (see protocol.py): standard library and torch only, relative imports.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .protocol import ProtocolError

# Tolerance of the cross-rank check: replicated states agree to the bit; partial sums of an
# all-reduce that has not happened yet differ by their own size.
TP_RTOL = 1e-3


# ---------------------------------------------------------------------------------------------
# the batch


@dataclass
class Segment:
    rid: str
    start: int  # first row of this request in the pass
    length: int  # rows (tokens) of this request in the pass
    prefix: int  # tokens of this request before this pass


def _ints(values) -> list[int] | None:
    if values is None:
        return None
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [int(v) for v in values]


def is_extend(batch) -> bool:
    mode = getattr(batch, "forward_mode", None)
    check = getattr(mode, "is_extend", None)
    return bool(check()) if callable(check) else False


def batch_segments(batch, rid_prefix: str) -> tuple[list[Segment], int]:
    """Our requests in an EXTEND pass and the pass's token count; ([], 0) for other passes."""
    if batch is None or not is_extend(batch):
        return [], 0
    rids = getattr(batch, "rids", None)
    if rids is None:
        raise ProtocolError(
            "the ForwardBatch carries no rids, so requests cannot be told apart; this release "
            "needs the import_hook mechanism, which adds them"
        )
    rids = list(rids)
    if not any(isinstance(r, str) and r.startswith(rid_prefix) for r in rids):
        return [], 0
    seq = _ints(getattr(batch, "extend_seq_lens_cpu", None))
    pre = _ints(getattr(batch, "extend_prefix_lens_cpu", None))
    if seq is None or pre is None or len(seq) != len(rids) or len(pre) != len(rids):
        raise ProtocolError(
            f"an EXTEND pass with {len(rids)} rids has extend_seq_lens_cpu={seq} and "
            f"extend_prefix_lens_cpu={pre}; both must list one length per request"
        )
    out, start = [], 0
    for rid, n, p in zip(rids, seq, pre, strict=True):
        if isinstance(rid, str) and rid.startswith(rid_prefix) and n > 0:
            out.append(Segment(rid, start, n, p))
        start += n
    return out, start


def find_batch(args, kwargs=None):
    """The ForwardBatch among a module's inputs (found by what it has, not by its class)."""
    for value in list(args) + list((kwargs or {}).values()):
        if hasattr(value, "forward_mode") and hasattr(value, "extend_seq_lens_cpu"):
            return value
    return None


def first_tensor(output) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise ProtocolError(f"a hooked module returned {type(output).__name__}, not a tensor")


def layer_output(output) -> tuple[torch.Tensor, bool]:
    """(the output of a decoder layer, whether SGLang left its all-reduce to the next layer).

    SGLang's decoder layers return (hidden_states, residual, ...) with the residual add fused
    into the next norm, so the layer's output is their sum.
    """
    hidden = first_tensor(output)
    pending = bool(getattr(hidden, "_sglang_needs_allreduce_fusion", False))
    if isinstance(output, (tuple, list)) and len(output) > 1:
        residual = output[1]
        if isinstance(residual, torch.Tensor):
            return hidden + residual, pending
    return hidden, pending


# ---------------------------------------------------------------------------------------------
# chunk order


class ChunkTracker:
    """The next expected prefix length of each request, to catch radix-cache hits and gaps."""

    def __init__(self, limit: int = 1 << 16):
        self._next: OrderedDict[str, int] = OrderedDict()
        self.limit = limit

    def check(self, rid: str, prefix: int, length: int) -> tuple[str, str] | None:
        expected = self._next.get(rid)
        if prefix == 0:
            self._next[rid] = length
        elif expected is None:
            return (
                "radix_prefix_hit",
                f"its first pass starts at token {prefix}: the server took the first {prefix} "
                "tokens from its prefix cache, so their states were never computed here. Start "
                "the server with --disable-radix-cache",
            )
        elif expected != prefix:
            return (
                "chunk_gap",
                f"a pass starts at token {prefix} but the previous one ended at {expected}",
            )
        else:
            self._next[rid] = prefix + length
        self._next.move_to_end(rid)
        while len(self._next) > self.limit:
            self._next.popitem(last=False)
        return None


# ---------------------------------------------------------------------------------------------
# tensor parallelism


@dataclass
class TensorParallel:
    """This process's tensor-parallel rank, and how to gather a small tensor from every rank."""

    rank: int = 0
    size: int = 1
    gather: Callable[[torch.Tensor], list[torch.Tensor]] | None = None

    def disagreement(self, rows: torch.Tensor) -> torch.Tensor | None:
        """A 0-dim bool tensor on the rows' device, true where the ranks hold other rows;
        None with one rank. Checked on a per-row fingerprint gathered from every rank, and
        computed without waiting for the GPU: the dump's writer reads it after the pass."""
        if self.size <= 1 or self.gather is None:
            return None
        fingerprint = rows.float().sum(dim=-1)
        parts = self.gather(fingerprint)
        ref = parts[0]
        if not ref.numel():
            return torch.zeros((), dtype=torch.bool, device=ref.device)
        atol = TP_RTOL * ref.abs().max().clamp_min(1.0)
        bad = torch.zeros((), dtype=torch.bool, device=ref.device)
        for other in parts[1:]:  # torch.allclose(other, ref, rtol=TP_RTOL, atol=atol), negated
            bad |= ((other - ref).abs() > atol + TP_RTOL * ref.abs()).any()
        return bad


def sglang_tensor_parallel() -> TensorParallel:
    """The rank and group of SGLang's tensor-parallel world; rank 0 of 1 outside a server.

    Only asked of an SGLang already imported (a server has set up its groups before it builds
    the model); importing SGLang here would be slow and could fail outside a server.
    """
    dist = sys.modules.get("sglang.srt.distributed")
    if dist is None:
        return TensorParallel()
    try:
        size = int(dist.get_tensor_model_parallel_world_size())
        rank = int(dist.get_tensor_model_parallel_rank())
        get_tp_group = dist.get_tp_group
    except Exception:  # distributed not set up in this process
        return TensorParallel()
    if size <= 1:
        return TensorParallel(rank, 1)
    group = get_tp_group().device_group

    def gather(t: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(t) for _ in range(size)]
        torch.distributed.all_gather(out, t.contiguous(), group=group)
        return out

    return TensorParallel(rank, size, gather)
