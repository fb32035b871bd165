"""A target folder as files: its config.json, its weights, its tokenizer files.

Loading the model (eyrie.target.load) and loading a multimodal wrapper's language model
(eyrie.target.wrapped) both start here, so every stage names a bad folder the same way: the
path, the config key (target.path) and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

from eyrie.common.errors import EyrieError
from eyrie.common.hf_config import text_config

KEY = "target.path"

# Files that define how text becomes token ids (any of them may be absent).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


class TargetError(EyrieError, ValueError):
    """A target folder that cannot be used; the message names the path, the key and the fix."""


def check_folder(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise TargetError(
            f"{KEY}: {path} is not a folder; point {KEY} at a Hugging Face model folder"
        )
    if not (path / "config.json").is_file():
        raise TargetError(f"{KEY}: {path} has no config.json; is it a Hugging Face model folder?")
    return path


def read_config(path: str | Path) -> dict:
    path = check_folder(path)
    try:
        return json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as exc:
        raise TargetError(f"{KEY}: {path / 'config.json'} is not valid JSON: {exc}") from None


def read_architecture(path: str | Path, configured: str | None = None) -> str:
    """The architecture class: target.architecture when set, else config.json's first entry."""
    if configured:
        return configured
    archs = read_config(path).get("architectures") or []
    if not archs:
        raise TargetError(
            f"{KEY}: {Path(path) / 'config.json'} lists no 'architectures'; "
            "set target.architecture in the config"
        )
    return archs[0]


def num_hidden_layers(path: str | Path) -> int:
    cfg = text_config(read_config(path))
    if "num_hidden_layers" not in cfg:
        raise TargetError(f"{KEY}: {Path(path) / 'config.json'} has no num_hidden_layers")
    return int(cfg["num_hidden_layers"])


def weight_files(path: str | Path) -> list[Path]:
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise TargetError(
            f"{KEY}: {path} holds no *.safetensors weights; convert the checkpoint to safetensors"
        )
    return files
