"""Where aux hidden states live in a transformers model: the decoder layers and the final norm.

Eyrie's convention: aux id i is the output of decoder layer i (0-based); the final state is the
output of the final norm. These helpers find both in any causal LM's module tree, without
knowing its architecture, and check the configured ids against the layer count.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from eyrie.common.errors import EyrieError

KEY = "capture.aux_layer_ids"
NORM_NAMES = ("norm", "final_layernorm", "ln_f")


class AuxLayerError(EyrieError, ValueError):
    """Aux layer ids that do not fit the target; the message names capture.aux_layer_ids."""


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's default for a target with ``num_layers`` layers: [1, L//2 - 1, L - 4]."""
    ids = [1, num_layers // 2 - 1, num_layers - 4]
    if num_layers < 7:  # below 7 layers the three ids collide or go negative
        raise AuxLayerError(
            f"the target has {num_layers} decoder layers, too few for EAGLE-3's default aux "
            f"ids {ids}; set {KEY} to distinct ids in 0..{num_layers - 1}"
        )
    return ids


def check_aux_layer_ids(ids: Sequence[int], num_layers: int) -> list[int]:
    """The ids as a list, if each is an int in [0, num_layers) and none repeats."""
    ids = list(ids)
    if not ids:
        raise AuxLayerError(f"{KEY} is empty; give at least one decoder layer id")
    seen = set()
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise AuxLayerError(f"{KEY}: {i!r} is not an integer layer id")
        if not 0 <= i < num_layers:
            raise AuxLayerError(
                f"aux layer id {i} is out of range: the target has {num_layers} decoder layers, "
                f"so ids must be in 0..{num_layers - 1}; fix {KEY}"
            )
        if i in seen:
            raise AuxLayerError(f"aux layer id {i} appears twice in {ids}; fix {KEY}")
        seen.add(i)
    return ids


def resolve_aux_layer_ids(configured, num_layers: int) -> list[int]:
    """capture.aux_layer_ids as extraction and validation take it: the configured ids, or
    EAGLE-3's default for the target's depth, checked against it."""
    try:
        ids = list(configured) if configured else list(default_aux_layer_ids(num_layers))
        check_aux_layer_ids(ids, num_layers)
    except ValueError as exc:
        raise AuxLayerError(f"{KEY}: {exc}") from None
    return [int(i) for i in ids]


def hidden_state(output, error: type[Exception]) -> torch.Tensor:
    """What a hook on a decoder layer or the final norm sees: the hidden state itself, or a
    tuple whose first element is it (transformers' layers return either, by version). Anything
    else raises ``error``, the caller's own class, so extraction and the decoding loop each
    fail in their own terms."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, tuple | list) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise error(f"a hooked module returned {type(output).__name__}, not a hidden state")


def num_hidden_layers(config) -> int | None:
    """``num_hidden_layers`` of a config, or of its text config (vision-language models)."""
    for cfg in (config, getattr(config, "text_config", None)):
        value = getattr(cfg, "num_hidden_layers", None) if cfg is not None else None
        if isinstance(value, int):
            return value
    return None


def find_decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The decoder-layer stack: the nn.ModuleList whose length is ``num_hidden_layers``.

    When several lists have that length (a vision tower of the same depth), the one named
    ``layers`` wins, then the shallowest.
    """
    want = num_hidden_layers(getattr(model, "config", None))
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and n]
    if want is None:
        raise AuxLayerError(
            f"{type(model).__name__} has no config.num_hidden_layers, so its decoder layers "
            "cannot be told apart from other module lists"
        )
    found = [(n, m) for n, m in lists if len(m) == want]
    if not found:
        sizes = ", ".join(f"{n} ({len(m)})" for n, m in lists) or "none"
        raise AuxLayerError(
            f"{type(model).__name__} has no nn.ModuleList of num_hidden_layers={want} modules "
            f"(module lists: {sizes})"
        )
    found.sort(key=lambda nm: (nm[0].rpartition(".")[2] != "layers", nm[0].count(".")))
    return found[0]


def find_final_norm(model: nn.Module) -> tuple[str, nn.Module]:
    """The norm applied after the last decoder layer: a sibling of the layer stack named
    ``norm``/``final_layernorm``/``ln_f``, else one of those directly under the base model."""
    layers_path, _ = find_decoder_layers(model)
    parent = layers_path.rpartition(".")[0]
    base = getattr(model, "base_model", None)
    base_path = next((n for n, m in model.named_modules() if m is base and n), "")
    for prefix in dict.fromkeys([parent, base_path]):
        for name in NORM_NAMES:
            path = f"{prefix}.{name}" if prefix else name
            module = _get(model, path)
            if module is not None:
                return path, module
    raise AuxLayerError(
        f"{type(model).__name__} has no final norm named {'/'.join(NORM_NAMES)} beside "
        f"{layers_path} or under its base model"
    )


def _get(model: nn.Module, path: str) -> nn.Module | None:
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return None
    return module if isinstance(module, nn.Module) else None
