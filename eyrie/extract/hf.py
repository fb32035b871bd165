"""Capture aux-layer and final hidden states in-process with forward hooks.

Only what is stored is kept: a hook on each configured decoder layer (aux id i = the output of
decoder layer i, 0-based) and one on the final norm (the final state). Hidden states of the other
layers are never gathered (no output_hidden_states). The final-norm hook ends the forward pass by
raising, so the lm_head (a vocab-sized matmul) is never computed.

Batches are right-padded with an attention mask; only the real tokens of each row come back. A
hook that does not fire, or fires twice, in one pass is an error: that is how a wrapper class
that routes around the hooked modules shows up, instead of as silently wrong data.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import torch

from eyrie.common.errors import EyrieError
from eyrie.extract.graphs import (
    GRAPH_ATTENTION,
    GraphCaptureFailed,
    GraphForward,
    attention_mask_4d,
    too_large_for_auto,
    why_not_graphs,
)
from eyrie.extract.job import Prepared, batches
from eyrie.target.layers import (
    check_aux_layer_ids,
    find_decoder_layers,
    find_final_norm,
    hidden_state,
)

if TYPE_CHECKING:
    from eyrie.extract.settings import CaptureSettings

log = logging.getLogger("eyrie.extract.hf")


class CaptureError(EyrieError, RuntimeError):
    """The hooks did not see what a forward pass of the target must show them."""


class _StopForward(Exception):
    """Raised by the final-norm hook: everything needed has been captured."""


def _row_views(aux: torch.Tensor, final: torch.Tensor, lengths: list[int]) -> list[tuple]:
    """Each row's real tokens of a padded batch: (aux (T, k, H), final (T, H)) views."""
    return [(aux[r, :n], final[r, :n]) for r, n in enumerate(lengths)]


def padded_batch(seqs, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, 0/1 mask) of `seqs`, right-padded to the longest, one row each."""
    ids = torch.full((len(seqs), max(map(len, seqs))), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.as_tensor(np.asarray(seq, dtype=np.int64))
        mask[row, : len(seq)] = 1
    return ids, mask


def _bf16(t: torch.Tensor) -> torch.Tensor:
    """t as bfloat16 (a bf16 target's states as they are: no call per batch for nothing)."""
    return t if t.dtype == torch.bfloat16 else t.to(torch.bfloat16)


class Pending:
    """Captured states whose copy to the host may still be running (see capture_pending).

    On CUDA each row also carries whether its states are all finite, found on the GPU before
    the copy (``(aux, final, finite)``), so the writer need not read every state again.
    """

    def __init__(self, rows: list, event, finite=None):
        self._rows, self._event, self._finite = rows, event, finite

    def result(self) -> list[tuple]:
        if self._event is not None:
            self._event.synchronize()
            self._event = None
            if self._finite is not None:
                flags = self._finite.tolist()
                self._rows = [(*row, flag) for row, flag in zip(self._rows, flags, strict=True)]
                self._finite = None
        return self._rows


class HFCapture:
    """Hooks installed on a loaded transformers model; call `capture` on batches of token ids."""

    def __init__(
        self,
        model: torch.nn.Module,
        aux_layer_ids: Sequence[int],
        *,
        pad_token_id: int | None = 0,
        stop_at_final_norm: bool = True,
        cuda_graphs: str | bool = False,
        batch_size: int = 8,
        bucket_tokens: int = 64,
        mask_4d: bool | None = None,
    ):
        """cuda_graphs: True runs the forward as graphs (eyrie.extract.graphs) over batches of
        at most `batch_size` rows padded to multiples of `bucket_tokens`; "auto" does too, but
        falls back to the eager forward if a graph cannot be captured; False: eager.

        mask_4d: the eager forward is given the 4-D causal-and-padding mask, built on the GPU,
        instead of the 2-D one. transformers turns a 2-D mask into that same 4-D mask, but reads
        its values on the host to do so (whether any token is padding), which makes the host
        wait for the GPU at every batch: it cannot queue the next batch's kernels while this
        one runs. None: on CUDA, with an attention that takes a 4-D mask as it is."""
        self.model = model
        self.aux_layer_ids = [int(i) for i in aux_layer_ids]
        self.layers_path, layers = find_decoder_layers(model)
        try:
            check_aux_layer_ids(self.aux_layer_ids, len(layers))
        except ValueError as exc:
            raise CaptureError(f"capture.aux_layer_ids: {exc}") from None
        self.norm_path, norm = find_final_norm(model)
        self.pad_token_id = 0 if pad_token_id is None else int(pad_token_id)
        self.stop = stop_at_final_norm
        self._copy_stream = None  # CUDA: the stream the states' copies to the host run on
        self._active = False  # the hooks record only during this capture's own forward
        self._aux: dict[int, list[torch.Tensor]] = {}
        self._final: list[torch.Tensor] = []
        self._handles = [
            layers[i].register_forward_hook(self._aux_hook(j))
            for j, i in enumerate(self.aux_layer_ids)
        ]
        self._handles.append(norm.register_forward_hook(self._final_hook))
        self._graphs, self._graphs_required = None, cuda_graphs is True
        attention = getattr(model.config, "_attn_implementation", None)
        if mask_4d is None:
            mask_4d = self._device().type == "cuda" and attention in GRAPH_ATTENTION
        # eager attention adds its mask: blocked positions as the dtype's minimum, not False
        additive = attention == "eager"
        self._mask_dtype = next(model.parameters()).dtype if additive else None
        self._mask_4d = bool(mask_4d)
        if cuda_graphs:
            # the decoder without lm_head ends at the final norm: no need to stop it there
            self.stop = False
            decoder = model.get_decoder()
            dtype = self._mask_dtype

            def states(ids, mask):  # static (B, T) inputs: the states as stored, and flags
                self._aux, self._final = {}, []
                keep = attention_mask_4d(mask, dtype)
                decoder(input_ids=ids, attention_mask=keep, use_cache=False)
                return self._stacked(mask)

            self._graphs = GraphForward(
                states,
                batch_size=batch_size,
                bucket_tokens=bucket_tokens,
                pad_token_id=self.pad_token_id,
                device=self._device(),
            )

    def _aux_hook(self, slot: int):
        def hook(module, args, output):
            if self._active:
                self._aux.setdefault(slot, []).append(hidden_state(output, CaptureError).detach())

        return hook

    def _final_hook(self, module, args, output):
        if not self._active:  # another forward of the model (another capture's, a check's)
            return
        self._final.append(hidden_state(output, CaptureError).detach())
        if self.stop:
            raise _StopForward

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def graph_stats(self) -> tuple[int, float]:
        """(CUDA graphs captured, seconds spent capturing them)."""
        g = self._graphs
        return (0, 0.0) if g is None else (len(g.graphs), g.capture_s)

    def _stacked(self, mask: torch.Tensor) -> tuple:
        """This pass's aux states stacked (B, T, k, H) and final (B, T, H), bf16 as stored, and
        on CUDA whether each row is finite over its real tokens (None elsewhere)."""
        aux, final = self._collect()
        self._aux, self._final = {}, []
        stacked, final = _bf16(torch.stack(aux, dim=2)), _bf16(final)
        if stacked.device.type != "cuda":
            return stacked, final, None
        ok = torch.isfinite(stacked).flatten(2).all(-1) & torch.isfinite(final).all(-1)
        return stacked, final, (ok | (mask == 0)).all(-1)

    def _eager(self, ids, mask, device, cuda: bool) -> tuple:
        self._aux, self._final = {}, []
        try:
            mask_dev = mask.to(device, non_blocking=cuda)
            self.model(
                input_ids=ids.to(device, non_blocking=cuda),
                attention_mask=attention_mask_4d(mask_dev, self._mask_dtype)
                if self._mask_4d
                else mask_dev,
                use_cache=False,
            )
        except _StopForward:
            pass
        return self._stacked(mask_dev)

    def _states(self, ids, mask, device, cuda: bool) -> tuple:
        self._active = True
        try:
            return self._forward(ids, mask, device, cuda)
        finally:
            self._active = False

    def _forward(self, ids, mask, device, cuda: bool) -> tuple:
        if self._graphs is None:
            return self._eager(ids, mask, device, cuda)
        try:
            return self._graphs.run(ids, mask)
        except GraphCaptureFailed as exc:
            if self._graphs_required:
                raise CaptureError(
                    f"capture.cuda_graphs is true, but {exc}; set capture.cuda_graphs to auto "
                    "(falls back to the eager forward) or false"
                ) from exc
            log.warning("%s; the forward runs eagerly from here on", exc)
            self._graphs, self.stop = None, True
            return self._eager(ids, mask, device, cuda)

    def capture(self, sequences: Sequence[np.ndarray]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """For each sequence: aux (T, k, H) and final (T, H), bfloat16 on the CPU."""
        if not sequences:
            return []
        return [(aux, final) for aux, final, *_ in self.capture_pending(sequences).result()]

    def capture_pending(self, sequences: Sequence[np.ndarray], host=None) -> Pending:
        """Like capture, but on CUDA the copies to the host are still under way when it returns.

        ``host(shape, dtype)`` gives the host buffers the states land in (the writer process's
        shared slab, eyrie/store/slabs.py); by default they are new pinned (CUDA) or plain
        tensors.

        The states are copied (non_blocking) into pinned host buffers behind the forward pass
        on the current stream, so the next batch's forward is queued without waiting for them;
        ``result()`` waits for the copy (a CUDA event), typically on the writer thread. On the
        CPU the result is ready at once.
        """
        if not sequences:
            return Pending([], None)
        if not self._handles:
            raise CaptureError("the capture hooks were removed (close() was called)")
        lengths = [len(s) for s in sequences]
        if min(lengths) == 0:
            raise CaptureError("an empty sequence cannot be captured")
        ids, mask = padded_batch(sequences, self.pad_token_id)
        device = self._device()
        cuda = device.type == "cuda"
        if cuda:  # pinned inputs: the copy is queued behind the previous batch, not waited for
            ids, mask = ids.pin_memory(), mask.pin_memory()
        with torch.inference_mode():
            stacked, final, finite = self._states(ids, mask, device, cuda)
        if cuda:
            bufs = [
                host(t.shape, t.dtype)
                if host is not None
                else torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                for t in (stacked, final)
            ]
            flags = torch.empty(finite.shape, dtype=torch.bool, pin_memory=True)
            # The copies run on a stream of their own, so the next batch's forward overlaps
            # them instead of waiting for them; the allocator keeps the GPU tensors until the
            # copy stream is done with them.
            if self._copy_stream is None:
                self._copy_stream = torch.cuda.Stream(device=device)
            copies = self._copy_stream
            copies.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(copies):
                for dst, src in zip((*bufs, flags), (stacked, final, finite), strict=True):
                    dst.copy_(src, non_blocking=True)
                    src.record_stream(copies)
                # blocking: the thread that waits for it (the writer's) sleeps rather than
                # spins in the driver beside the thread launching the forward's kernels
                done = torch.cuda.Event(blocking=True)
                done.record(copies)
            # each row is a view of its own buffer, which is never reused before its commit
            return Pending(_row_views(*bufs, lengths), done, flags)
        stacked, final = stacked.cpu(), final.cpu()  # (B, T, k, H), (B, T, H)
        if host is not None:  # one copy into the given buffers; rows are views of them
            bufs = [host(t.shape, t.dtype).copy_(t) for t in (stacked, final)]
            return Pending(_row_views(*bufs, lengths), None)
        rows = [(a.clone(), f.clone()) for a, f in _row_views(stacked, final, lengths)]
        return Pending(rows, None)

    def _collect(self) -> tuple[list[torch.Tensor], torch.Tensor]:
        for slot, layer in enumerate(self.aux_layer_ids):
            seen = len(self._aux.get(slot, []))
            if seen != 1:
                raise CaptureError(
                    f"the hook on {self.layers_path}[{layer}] fired {seen} times in one forward "
                    "pass (expected once): the model's forward does not run through the hooked "
                    "decoder layers"
                )
        if len(self._final) != 1:
            raise CaptureError(
                f"the hook on the final norm {self.norm_path} fired {len(self._final)} times in "
                "one forward pass (expected once)"
            )
        return [self._aux[s][0] for s in range(len(self.aux_layer_ids))], self._final[0]


class HFBackend:
    """The extract job's capture (eyrie.extract.job.Capture) with the target loaded here.

    Batches of a commit group are captured on this thread; their copies to the host finish on
    the writer thread, while the next group's forward passes run (at most `writer_queue`
    captured groups wait for it; 0 writes on this thread).
    """

    backend, label = "hf", ""
    seconds_keys = ("setup", "capture", "write", "wait", "total")
    writer_queue = 1

    def __init__(self, capture: CaptureSettings, *, architecture=None, target=None):
        self.settings, self.architecture = capture, architecture
        self.target = target
        self.aux_ids: list[int] = []
        self.graphs: str | bool = False  # capture.cuda_graphs, resolved for the loaded target
        self._graph_stats = (0, 0.0)  # the last session's (graphs captured, seconds)

    def prepare(self, target_path, aux_ids: list[int]):
        from eyrie.target.load import load_target

        if self.target is None:
            device = self.settings.device
            self.target = load_target(target_path, device=device, architecture=self.architecture)
        self.aux_ids = aux_ids
        t = self.target
        # checked before the job tokenizes or starts its writer
        self.graphs = cuda_graphs_for(self.settings.cuda_graphs, t.model, t.device)
        hidden = int(t.model.config.get_text_config().hidden_size)
        return Prepared(t.tokenizer, t.architecture, t.device, t.dtype, hidden)

    @contextmanager
    def session(self, todo: bool, batch_size: int):
        pad_id, graphs = self.target.tokenizer.pad_token_id, self.graphs
        bucket = self.settings.graph_bucket_tokens
        if todo:
            log.info(
                "capture forward: %s",
                f"CUDA graphs, batches padded to multiples of {bucket} tokens"
                if graphs
                else f"eager ({self._why_eager()})",
            )
        self._graph_stats = (0, 0.0)
        with HFCapture(
            self.target.model,
            self.aux_ids,
            pad_token_id=pad_id,
            cuda_graphs=graphs,
            batch_size=batch_size,
            bucket_tokens=bucket,
        ) as cap:

            def submit(group, host=None):
                captured = [
                    (batch, cap.capture_pending([group[i].input_ids for i in batch], host))
                    for batch in batches(group, batch_size)
                ]

                def resolve() -> list:
                    results = {
                        i: out
                        for batch, pending in captured
                        for i, out in zip(batch, pending.result(), strict=True)
                    }
                    return [results[i] for i in range(len(group))]

                return resolve

            try:
                yield submit
            finally:
                self._graph_stats = cap.graph_stats

    def _why_eager(self) -> str:
        setting = self.settings.cuda_graphs
        if setting in (False, "false"):
            return "capture.cuda_graphs is false"
        model, device = self.target.model, self.target.device
        return why_not_graphs(model, device) or too_large_for_auto(model) or "graphs failed"

    def finish(self, outcome) -> None:
        count, seconds = self._graph_stats
        if count:
            outcome.seconds["graph_capture"] = seconds
            log.info("%d CUDA graphs of the forward captured in %.1f s", count, seconds)


def cuda_graphs_for(setting, model: torch.nn.Module, device: torch.device) -> str | bool:
    """capture.cuda_graphs resolved: "auto" where graphs can run (HFCapture falls back to the
    eager forward if a capture fails), True where they must, False for the eager forward."""
    if setting in (False, "false"):
        return False
    why = why_not_graphs(model, device)
    if setting in (True, "true"):
        if why is not None:
            raise CaptureError(
                f"capture.cuda_graphs is true, but {why}; set capture.cuda_graphs to auto or false"
            )
        return True
    if setting != "auto":
        raise CaptureError(f"capture.cuda_graphs: {setting!r}; use auto, true or false")
    return "auto" if why is None and too_large_for_auto(model) is None else False
