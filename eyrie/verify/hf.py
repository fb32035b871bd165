"""The verify check for the transformers backend: build the target's module tree on the
``meta`` device (no weights, no memory) and find where each aux id and the final state come from.
torch and transformers are imported only when the check runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from eyrie.verify.source import VerifyError


def config_folder(target: str | Path) -> Path:
    """The folder of a target given as a model folder or as its config.json."""
    path = Path(target)
    folder = path.parent if path.name == "config.json" else path
    if not (folder / "config.json").is_file():
        raise VerifyError(
            f"target.path: {folder} has no config.json; point it at a Hugging Face model folder"
        )
    return folder


def read_config_json(target: str | Path) -> dict:
    path = config_folder(target) / "config.json"
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise VerifyError(f"{path} is not valid JSON ({exc}); fix or replace it") from None
    if not isinstance(data, dict):
        raise VerifyError(f"{path} must hold a JSON object")
    return data


def meta_model(target: str | Path):
    """The target's causal LM built from its config on the meta device: shapes, no weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = config_folder(target)
    try:
        cfg = AutoConfig.from_pretrained(folder)
    except (ValueError, KeyError, OSError) as exc:
        raise VerifyError(
            f"transformers cannot read {folder / 'config.json'} ({exc}); use capture.backend: "
            "sglang for model types transformers does not know"
        ) from None
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    except (ValueError, KeyError) as exc:
        raise VerifyError(
            f"transformers has no causal LM for model_type {cfg.model_type!r} ({exc})"
        ) from None
    return cfg, model


def check_hf(target: str | Path, aux_ids: list[int] | None = None) -> dict:
    """Find the decoder layers and final norm; check the aux ids against the layer count.

    Raises VerifyError with a plain sentence when the tree or the ids are unusable.
    """
    from eyrie.target.layers import (
        check_aux_layer_ids,
        default_aux_layer_ids,
        find_decoder_layers,
        find_final_norm,
        num_hidden_layers,
    )

    cfg, model = meta_model(target)
    arch = (getattr(cfg, "architectures", None) or [type(model).__name__])[0]
    try:
        layers_path, layers = find_decoder_layers(model)
        norm_path, norm = find_final_norm(model)
    except ValueError as exc:
        raise VerifyError(f"{arch}: {exc}") from None
    declared = num_hidden_layers(cfg)
    n = len(layers)
    try:
        ids = check_aux_layer_ids(aux_ids, n) if aux_ids else default_aux_layer_ids(n)
    except ValueError as exc:
        raise VerifyError(f"{arch}: {exc}") from None
    return {
        "architecture": arch,
        "model_class": type(model).__name__,
        "verdict": "ok",
        "why": (
            f"{type(model).__name__} has {n} decoder layers at {layers_path} and a final norm at "
            f"{norm_path} ({type(norm).__name__}); every aux id is a distinct layer in 0..{n - 1}."
        ),
        "layers_path": layers_path,
        "num_layers": n,
        "num_hidden_layers": declared,
        "norm_path": norm_path,
        "norm_class": type(norm).__name__,
        "aux_layer_ids": ids,
        "aux_ids_source": "capture.aux_layer_ids" if aux_ids else "EAGLE-3 default",
        "aux_modules": [f"{layers_path}.{i}" for i in ids],
    }
