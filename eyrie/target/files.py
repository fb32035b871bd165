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
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


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
    """The architecture class: target.architecture when set, else config.json's first entry.

    A target.architecture that config.json does not list is refused: transformers and SGLang
    both build the class config.json names, so another name would be checked but not run.
    """
    archs = read_config(path).get("architectures") or []
    if configured:
        if archs and configured not in archs:
            raise TargetError(
                f"target.architecture is {configured!r}, but {Path(path) / 'config.json'} "
                f"declares {archs}, and that is the class transformers and SGLang build from "
                "the folder. Remove target.architecture (null takes config.json's), or set it to "
                f"{archs[0]!r}; to run another class, change 'architectures' in config.json"
            )
        return configured
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
        other = sorted(p.name for p in Path(path).glob("*.bin")) + sorted(
            p.name for p in Path(path).glob("*.pt")
        )
        found = f" (it has {', '.join(other[:3])}: pickled weights, never loaded)" if other else ""
        raise TargetError(
            f"{KEY}: {path} holds no *.safetensors weights{found}; copy the model's "
            "*.safetensors files into the folder, or convert the checkpoint to safetensors"
        )
    return files


def has_chat_template(path: str | Path) -> bool:
    """Whether the folder gives its tokenizer a chat template (a template file, or the
    'chat_template' of tokenizer_config.json), as transformers looks for one."""
    path = Path(path)
    if any((path / n).is_file() for n in CHAT_TEMPLATE_FILES):
        return True
    try:
        cfg = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and bool(cfg.get("chat_template"))


def check_files(path: str | Path) -> None:
    """What extraction loads, checked from the file names alone (no weights read): safetensors
    weights, every shard an index names, a tokenizer and a chat template."""
    path = check_folder(path)
    files = weight_files(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (ValueError, AttributeError):
            raise TargetError(f"{KEY}: {index} is not a safetensors index; replace it") from None
        missing = sorted(shards - {f.name for f in files})
        if missing:
            raise TargetError(
                f"{KEY}: {index} names {len(missing)} weight file(s) the folder lacks "
                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); copy them in"
            )
    if not any((path / n).is_file() for n in TOKENIZER_FILES):
        raise TargetError(
            f"{KEY}: {path} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); copy the "
            "target's tokenizer files into the folder"
        )
    if not has_chat_template(path):
        raise TargetError(no_chat_template(path))


def no_chat_template(path: str | Path) -> str:
    return (
        f"{KEY}: the tokenizer in {path} has no chat template, and every conversation is "
        "rendered with it; add chat_template.jinja (or 'chat_template' in "
        "tokenizer_config.json) to the folder: for a base model, its instruct sibling's"
    )
