"""The language model of a multimodal wrapper, loaded alone with transformers.

A wrapper such as Kimi-K2.5's `KimiK25ForConditionalGeneration` (a vision tower and projector
around a DeepSeek-V3 language model) is not a transformers class, yet with text-only prompts its
hidden states are those of the language model it holds. So the transformers side of Eyrie (the
validate spot check, the transformers capture backend, the CPU stand-in of an SGLang server)
loads that language model from the wrapper's own folder: the config's `text_config`, and the
weight file's tensors under the wrapper's prefix (`language_model.`), strictly: a missing or
unexpected tensor is an error, and only the vision tensors are left out on purpose.

`served_tree` gives the module tree SGLang builds for the wrapper (the language model mounted
at `language_model`), so module names such as `language_model.model.layers.3` mean there what
they mean in the SGLang server.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from eyrie.target.files import KEY, TargetError, read_architecture, read_config, weight_files


@dataclass(frozen=True)
class Wrapper:
    """How a wrapper architecture holds its language model."""

    prefix: str  # of the language model's tensors in the wrapper's weights
    text_class: str  # the transformers class of the language model
    config_key: str  # the language model's config inside config.json
    skipped: tuple[str, ...]  # prefixes of the tensors that are not the language model's


WRAPPERS = {
    "KimiK25ForConditionalGeneration": Wrapper(
        prefix="language_model.",
        text_class="DeepseekV3ForCausalLM",
        config_key="text_config",
        skipped=("vision_tower.", "mm_projector."),
    ),
}


def language_model_config(path: str | Path, arch: str):
    """The language model's transformers config, from the wrapper's `text_config`."""
    import transformers

    w = WRAPPERS[arch]
    cfg = read_config(path)
    text = cfg.get(w.config_key)
    if not isinstance(text, dict):
        raise TargetError(
            f"{KEY}: {Path(path) / 'config.json'} is a {arch} config without a "
            f"'{w.config_key}' object; the language model's config belongs there"
        )
    cls = getattr(transformers, w.text_class)
    text = {k: v for k, v in text.items() if k not in ("architectures", "model_type")}
    return cls.config_class(**text)


def check_tensor_names(path: str | Path, arch: str) -> None:
    """Every tensor of the wrapper's weight files is the language model's or a vision one;
    read from the files' headers alone, before any tensor is loaded."""
    from safetensors import safe_open

    w = WRAPPERS[arch]
    for f in weight_files(path):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open is not a dict
                if not name.startswith((w.prefix, *w.skipped)):
                    raise TargetError(
                        f"{KEY}: {f} holds {name!r}, which is neither the language model's "
                        f"({w.prefix}...) nor a vision tensor ({', '.join(w.skipped)}); is "
                        f"this a {arch} checkpoint?"
                    )


def load_language_model(path: str | Path, arch: str, device: torch.device, dtype: torch.dtype):
    """The wrapper's language model as a transformers model in eval mode, weights loaded
    strictly (every parameter and persistent buffer, nothing but the vision tensors left).

    The tensors are read by transformers' own `from_pretrained`, with the wrapper's prefix
    mapped away: a checkpoint names its tensors as published (DeepSeek-V3's experts one by
    one, `mlp.experts.E.gate_proj.weight`), which is the form SGLang loads too, and only
    from_pretrained converts that to the module layout of the installed transformers.
    """
    import re

    import transformers

    w = WRAPPERS[arch]
    config = language_model_config(path, arch)
    check_tensor_names(path, arch)
    kwargs = {"local_files_only": True, "trust_remote_code": False, "dtype": dtype}
    if device.type == "cuda":
        kwargs["device_map"] = str(device)
    model, info = getattr(transformers, w.text_class).from_pretrained(
        str(path),
        config=config,
        key_mapping={f"^{re.escape(w.prefix)}": ""},
        output_loading_info=True,
        **kwargs,
    )
    missing = sorted(info.get("missing_keys") or [])
    unexpected = sorted(k for k in info.get("unexpected_keys") or [] if not k.startswith(w.skipped))
    mismatched = list(info.get("mismatched_keys") or [])
    if missing or unexpected or mismatched:
        raise TargetError(
            f"{KEY}: the {w.prefix}* tensors of {path} do not fit {w.text_class} built from its "
            f"{w.config_key}: missing {missing[:5]}, unexpected {unexpected[:5]}, mismatched "
            f"{mismatched[:5]}; the weights and config.json disagree"
        )
    return model.to(device).eval()


class ServedTree(torch.nn.Module):
    """The wrapper's module tree as SGLang names it, around the language model (no vision
    modules: text-only prompts never reach them)."""

    def __init__(self, attr: str, language_model: torch.nn.Module):
        super().__init__()
        self.add_module(attr, language_model)


def served_tree(path: str | Path, model: torch.nn.Module) -> torch.nn.Module:
    """The module tree whose names SGLang uses for the folder's architecture: the model itself,
    or for a wrapper its language model mounted where the wrapper holds it."""
    arch = read_architecture(path)
    if arch not in WRAPPERS:
        return model
    return ServedTree(WRAPPERS[arch].prefix.rstrip("."), model)
