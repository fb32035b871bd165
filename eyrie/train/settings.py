"""The training settings (config section `train`): their defaults and the one error of training.

The defaults are the config schema's own (eyrie/schemas/config.schema.yaml), read once here, so
a run through Snakemake, through `eyrie train` and through `train()` from Python start from the
same values and a key the schema lacks is refused by name.
"""

from __future__ import annotations

import copy

from eyrie.common.config import schema
from eyrie.common.errors import EyrieError

# settings that do not change the numbers: a resume may change them
RUNTIME_KEYS = ("num_workers", "checkpoint_every", "keep_checkpoints", "processes", "rdzv_host")


class TrainError(EyrieError, RuntimeError):
    """Training cannot start or continue as asked; the message names the input and the fix."""


def _schema_defaults() -> dict:
    train = schema()["properties"]["train"]["properties"]
    out = {key: copy.deepcopy(sub["default"]) for key, sub in train.items()}
    out["dflash"] = {k: v["default"] for k, v in train["dflash"]["properties"].items()}
    return out


DEFAULTS = _schema_defaults()
NESTED = ("dflash",)  # sections whose keys are filled one by one


def settings_with_defaults(settings: dict | None) -> dict:
    """DEFAULTS overlaid with ``settings``; an unknown key is refused with the known ones."""
    out = copy.deepcopy(DEFAULTS)
    for key, value in (settings or {}).items():
        if key not in DEFAULTS:
            raise TrainError(f"train.{key} is not a training setting; known: {sorted(DEFAULTS)}")
        out[key] = {**out[key], **(value or {})} if key in NESTED else value
    return out
