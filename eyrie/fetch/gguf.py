"""A GGUF file as a standard transformers folder: safetensors weights, tokenizer, chat template.

transformers reads a GGUF itself (``from_pretrained(folder, gguf_file=name)``, with the `gguf`
and `accelerate` packages) and dequantizes its weights, but will not save a model it loaded that
way: the model keeps the GGUF quantization config. The weights are therefore moved, without a
copy, into a fresh model of the same class built from the config without it, and saved from
there; the tokenizer (with the chat template the file carries) is saved beside them, and
``eyrie-source.json`` says where it all came from. The folder is written under a temporary
name and renamed into place.
"""

from __future__ import annotations

import copy
import importlib.util
import shutil
import tempfile
from pathlib import Path

from eyrie.common.atomic import replace_folder, write_json
from eyrie.common.provenance import package_versions
from eyrie.fetch.spec import PROVENANCE, FetchError

DTYPE = "bfloat16"  # what the weights are saved in, whatever the GGUF's quantization
NEEDS = ("gguf", "accelerate")  # what transformers needs to read a GGUF


def check_packages() -> None:
    missing = [p for p in NEEDS if importlib.util.find_spec(p) is None]
    if missing:
        raise FetchError(
            f"reading a GGUF file needs the Python package(s) {', '.join(missing)}, which this "
            "environment lacks; install Eyrie with its gguf extra (pip install -e '.[gguf]' in "
            f"the checkout), or pip install {' '.join(missing)}"
        )


def load_dequantized(gguf: Path, dtype: str = DTYPE):
    """The GGUF's model, dequantized by transformers into `dtype`, on the CPU."""
    import torch
    import transformers

    check_packages()
    kwargs = {"dtype": getattr(torch, dtype), "local_files_only": True}
    if hasattr(transformers, "GgufConfig"):  # say so, or transformers warns of packed weights
        kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, **kwargs
        ).eval()
    except (ValueError, NotImplementedError, KeyError) as exc:
        raise FetchError(
            f"transformers cannot read {gguf} as a causal language model ({exc}); Eyrie converts "
            "the GGUF architectures the installed transformers reads (llama, mistral, qwen2, "
            "qwen3, ...): use a GGUF of one of those, or a transformers model folder"
        ) from None


def plain_copy(model):
    """A model of the same class whose config has no quantization config, holding the same
    weight tensors (moved, not copied), so that save_pretrained takes it."""
    import torch

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        fresh = type(model)(config)
    fresh.load_state_dict(model.state_dict(), strict=True, assign=True)
    fresh.tie_weights()
    fresh.generation_config = copy.deepcopy(model.generation_config)
    return fresh.eval()


def _tokenizer(gguf: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        gguf.parent, gguf_file=gguf.name, local_files_only=True
    )
    for key in ("is_local", "local_files_only"):  # how it was loaded here, not what it is
        tokenizer.init_kwargs.pop(key, None)
    return tokenizer


def provenance(source: dict, model, tokenizer) -> dict:
    """What the folder was made from and with."""
    cfg = model.config
    return {
        **source,
        "converted_to": DTYPE,
        "architecture": (cfg.architectures or [type(model).__name__])[0],
        "chat_template": bool(tokenizer.chat_template),
        "versions": package_versions(("torch", "transformers", "tokenizers", *NEEDS)),
    }


def convert(gguf: str | Path, out: str | Path, source: dict) -> Path:
    """Write the transformers folder of `gguf` to `out` (replacing what was there); `source`
    (package, version, hashes, ...) goes into its eyrie-source.json."""
    gguf, out = Path(gguf), Path(out)
    if not gguf.is_file():
        raise FetchError(f"GGUF file {gguf} does not exist; give the path of a .gguf file")
    model = plain_copy(load_dequantized(gguf))
    model.config.architectures = [type(model).__name__]
    tokenizer = _tokenizer(gguf)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_json(tmp / PROVENANCE, provenance(source, model, tokenizer))
        replace_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
