"""The target in the decoding loops: logits and aux states of one forward pass over its KV cache.

Aux states are captured with forward hooks on the target's decoder layers during its passes
(aux id i = the output of decoder layer i), so the target runs once per step, unmodified. A
pass extends a transformers DynamicCache; the loops crop the rejected drafts' entries from it.
"""

from __future__ import annotations

import inspect

import torch

from eyrie.common.errors import EyrieError
from eyrie.target.layers import check_aux_layer_ids, find_decoder_layers, hidden_state


class SpeculateError(EyrieError, RuntimeError):
    """Speculative decoding cannot run as asked; the message names the input and the fix.

    Here, the module the other parts of the loop (drafters, loops, loading) all import."""


class Target:
    """A loaded causal LM with hooks on its aux layers; ``forward`` extends a DynamicCache."""

    def __init__(self, model: torch.nn.Module, aux_layer_ids: list[int] | None = None):
        self.model = model.eval()
        self.aux_layer_ids = list(aux_layer_ids or [])
        _, layers = find_decoder_layers(model)
        if self.aux_layer_ids:
            try:
                check_aux_layer_ids(self.aux_layer_ids, len(layers))
            except ValueError as exc:
                raise SpeculateError(f"the drafter's aux_layer_ids: {exc}") from None
        self._seen: dict[int, torch.Tensor] = {}
        self._handles = [
            layers[i].register_forward_hook(self._hook(j)) for j, i in enumerate(self.aux_layer_ids)
        ]
        # transformers renamed the cache argument (past_key_values -> cache) within 5.x
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def _hook(self, slot: int):
        def hook(module, args, output):
            self._seen[slot] = hidden_state(output, SpeculateError)

        return hook

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(
        self, ids: list[int], cache, attention_mask=None, positions=None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits (T, V), aux (1, T, k, H) or None) of ``ids`` appended to ``cache``.

        A tree pass gives ``attention_mask`` (T, cached + T) bool, True where a token attends,
        and each token's ``positions``; by default the tokens follow the cache causally."""
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        extra = {self._cache_kw: cache}
        if attention_mask is not None:
            extra["attention_mask"] = attention_mask[None, None].to(self.device)
            extra["position_ids"] = torch.tensor([positions], device=self.device)
        self._seen = {}
        out = self.model(input_ids=x, use_cache=True, **extra)
        aux = None
        if self.aux_layer_ids:
            if len(self._seen) != len(self.aux_layer_ids):
                raise SpeculateError(
                    "the hooks on the target's aux layers did not fire: its forward does not run "
                    "through the decoder layers eyrie.target.layers found"
                )
            aux = torch.stack([self._seen[j] for j in range(len(self.aux_layer_ids))], dim=2)
        self._seen = {}
        return out.logits[0], aux

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def cache_length(cache) -> int:
    return int(cache.get_seq_length())


def crop_cache(cache, keep: int) -> None:
    """Keep the first ``keep`` positions (a negative crop removes tokens in every 5.x release)."""
    drop = cache_length(cache) - keep
    if drop > 0:
        cache.crop(-drop)
