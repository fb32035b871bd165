"""The trained drafter's folder, as the train stage leaves it: drafter.json + model.safetensors.

eyrie/train/trainer.py writes it (weights first, drafter.json last); export and evaluate read
it through read_drafter, so the checks of what counts as a trained drafter live in one place.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eyrie.train.model import DrafterError


def read_drafter(folder) -> tuple[dict, dict[str, torch.Tensor]]:
    """(drafter.json, state dict) of a trained drafter folder; DrafterError names what is off."""
    from safetensors.torch import load_file

    folder = Path(folder)
    meta_path, weights = folder / "drafter.json", folder / "model.safetensors"
    if not meta_path.is_file() or not weights.is_file():
        raise DrafterError(
            f"{folder} is not a trained drafter (needs drafter.json and model.safetensors); "
            "run the train stage (`eyrie train`) first"
        )
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != "eyrie-drafter" or meta.get("layer_convention") != "output":
        raise DrafterError(
            f"{meta_path} is not an Eyrie drafter description (format or layer convention); "
            "retrain it"
        )
    return meta, load_file(str(weights))
