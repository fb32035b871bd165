"""Load a target model folder for in-process capture, and describe it for provenance.

A target is a local Hugging Face folder: config.json, safetensors weights, a fast tokenizer with a
chat template. Nothing is fetched from a hub and no code from the folder is executed. On CUDA the
model runs in bfloat16 (as it is served); on the CPU in float32, since CPU bf16 kernels are slow.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch

from eyrie.common.errors import EyrieError

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

PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "zarr", "numcodecs", "numpy")


class TargetError(EyrieError, ValueError):
    """A target folder that cannot be used; the message names the path, the key and the fix."""


@dataclass
class Target:
    path: Path
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    architecture: str


def resolve_device(device: str = "auto") -> torch.device:
    """auto takes CUDA when present; cuda without a GPU is an error rather than a silent CPU run."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise TargetError(
                "capture.device is 'cuda' but torch sees no CUDA device "
                f"(torch {torch.__version__}); use 'auto' or 'cpu', or run on a GPU node"
            )
        return torch.device("cuda")
    if device == "cpu":
        return torch.device("cpu")
    raise TargetError(f"capture.device: {device!r} is not one of auto, cpu, cuda")


def capture_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


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
    cfg = read_config(path)
    cfg = cfg.get("text_config", cfg)
    if "num_hidden_layers" not in cfg:
        raise TargetError(f"{KEY}: {Path(path) / 'config.json'} has no num_hidden_layers")
    return int(cfg["num_hidden_layers"])


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
        raise TargetError(
            f"{KEY}: the tokenizer in {path} has no chat template; add chat_template.jinja "
            "(or 'chat_template' in tokenizer_config.json) to the folder"
        )
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


def weight_files(path: str | Path) -> list[Path]:
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise TargetError(
            f"{KEY}: {path} holds no *.safetensors weights; convert the checkpoint to safetensors"
        )
    return files


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def _combined(files: list[Path], cache_file: str | Path | None = None) -> str:
    """sha256 over (name, sha256 of file) pairs; per-file digests may be cached by size+mtime."""
    cache: dict = {}
    if cache_file and Path(cache_file).is_file():
        try:
            cache = json.loads(Path(cache_file).read_text())
        except json.JSONDecodeError:
            cache = {}
    outer = hashlib.sha256()
    changed = False
    for f in files:
        st = f.stat()
        key = f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}"
        if key not in cache:
            cache[key] = _file_sha256(f)
            changed = True
        outer.update(f"{f.name}:{cache[key]}\n".encode())
    if cache_file and changed:
        cache_file = Path(cache_file)
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_file.parent, prefix=cache_file.name)
        with os.fdopen(fd, "w") as out:
            json.dump(cache, out, indent=1)
        os.replace(tmp, cache_file)
    return outer.hexdigest()


def weights_sha256(path: str | Path, cache_file: str | Path | None = None) -> str:
    """One digest for all safetensors files of the folder (hundreds of GB: pass a cache file)."""
    return _combined(weight_files(path), cache_file)


def tokenizer_sha256(path: str | Path) -> str:
    files = [Path(path) / n for n in TOKENIZER_FILES if (Path(path) / n).is_file()]
    if not files:
        raise TargetError(f"{KEY}: {path} holds no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    return _combined(files)


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in (*PACKAGES, "eyrie"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


TOY_DEEPSEEK = "toy-deepseek"
TOYS = (TOY_DEEPSEEK, "toy-kimi-k25")


def configured_dir(config: dict) -> Path:
    """The target folder a workflow config names (a toy is built under results/targets/)."""
    path = config["target"]["path"]
    if path in TOYS:
        return Path(config.get("results", "results")) / "targets" / path
    return Path(path)
