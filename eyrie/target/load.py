"""Load a target model folder for in-process capture, and describe it for provenance.

A target is a local Hugging Face folder: config.json, safetensors weights, a fast tokenizer with a
chat template. Nothing is fetched from a hub and no code from the folder is executed. On CUDA the
model runs in bfloat16 (as it is served); on the CPU in float32, since CPU bf16 kernels are slow.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from eyrie.common.layout import Layout
from eyrie.common.provenance import package_versions
from eyrie.target.files import (
    KEY,
    TOKENIZER_FILES,
    TargetError,
    check_folder,
    no_chat_template,
    num_hidden_layers,
    read_architecture,
    read_config,
    weight_files,
)
from eyrie.target.identity import tokenizer_sha256, weights_sha256

# Callers that load a target also name its folder's pieces and the versions it ran with.
__all__ = [
    "KEY",
    "TOKENIZER_FILES",
    "Target",
    "TargetError",
    "capture_dtype",
    "check_folder",
    "configured_dir",
    "load_model",
    "load_target",
    "load_tokenizer",
    "num_hidden_layers",
    "package_versions",
    "read_architecture",
    "read_config",
    "resolve_device",
    "tokenizer_sha256",
    "weight_files",
    "weights_sha256",
]


@dataclass
class Target:
    path: Path
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    architecture: str


def resolve_device(device: str = "auto") -> torch.device:
    """capture.device as a torch device (eyrie.common.device's one rule); errors are the
    target's: cuda without a GPU is refused rather than run silently on the CPU."""
    from eyrie.common.device import DeviceError, pick_device

    try:
        return pick_device(device, "capture.device")
    except DeviceError as exc:
        raise TargetError(f"{exc} (torch {torch.__version__})") from None


def capture_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_tokenizer(path: str | Path):
    """A fast tokenizer with a chat template (offsets are needed for the loss mask)."""
    from transformers import AutoTokenizer

    path = check_folder(path)
    if not any((path / n).is_file() for n in TOKENIZER_FILES):
        raise TargetError(
            f"{KEY}: {path} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); copy the "
            "target's tokenizer files into the folder"
        )
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise TargetError(f"{KEY}: cannot load a tokenizer from {path}: {exc}") from None
    if not getattr(tok, "chat_template", None):
        raise TargetError(no_chat_template(path))
    if not getattr(tok, "is_fast", False):
        raise TargetError(
            f"{KEY}: the tokenizer in {path} is not a fast tokenizer (no tokenizer.json); "
            "character offsets are needed for the loss mask"
        )
    return tok


def load_model(path: str | Path, device: torch.device, architecture: str | None = None):
    """The model in eval mode on `device`, in the capture dtype; no remote code."""
    import transformers

    from eyrie.target.wrapped import WRAPPERS, load_language_model

    path = check_folder(path)
    arch = read_architecture(path, architecture)
    cls = getattr(transformers, arch, None)
    if cls is None and arch in WRAPPERS:  # a multimodal wrapper: its language model alone
        weight_files(path)
        return load_language_model(path, arch, device, capture_dtype(device)), arch
    if cls is None or not hasattr(cls, "from_pretrained"):
        raise TargetError(
            f"{KEY}: architecture {arch!r} of {path} is not in transformers "
            f"{transformers.__version__}; use capture.backend 'sglang' for this target"
        )
    weight_files(path)  # safetensors only: never unpickle weights
    kwargs = {"local_files_only": True, "trust_remote_code": False, "dtype": capture_dtype(device)}
    if device.type == "cuda":
        kwargs["device_map"] = str(device)
    model = cls.from_pretrained(path, **kwargs)
    return model.to(device).eval(), arch


def load_target(path: str | Path, *, device: str = "auto", architecture: str | None = None):
    dev = resolve_device(device)
    tokenizer = load_tokenizer(path)
    model, arch = load_model(path, dev, architecture)
    return Target(Path(path), model, tokenizer, dev, capture_dtype(dev), arch)


TOY_DEEPSEEK = "toy-deepseek"
TOYS = (TOY_DEEPSEEK, "toy-kimi-k25")


def configured_dir(config: dict) -> Path:
    """The target folder a workflow config names (a toy, or the folder of a GGUF file or a
    package, is built under results/targets/: rules/target.smk)."""
    from eyrie.fetch.spec import slug
    from eyrie.fetch.stage import is_fetched_target

    path = config["target"]["path"]
    if path in TOYS:
        return Layout.of(config).targets() / path
    if is_fetched_target(path):
        return Layout.of(config).targets() / slug(path)
    return Path(path)
