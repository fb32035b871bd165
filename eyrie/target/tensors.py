"""The target's embedding, lm_head and final norm, read alone from its safetensors.

The drafter shares the target's (frozen) input embedding, is scored against its lm_head and may
start its norm at the target's final norm; these are read from the weight files by name,
without loading the model: a sharded folder through its index, a tied lm_head as the embedding.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eyrie.common.errors import DrafterError
from eyrie.common.hf_config import text_config

EMBED_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight", "transformer.wte.weight")
HEAD_NAMES = ("lm_head.weight", "output.weight")
NORM_NAMES = ("model.norm.weight", "norm.weight", "model.language_model.norm.weight")


def _weight_index(folder: Path) -> dict[str, Path]:
    """tensor name -> file, from model.safetensors.index.json or the files' own headers."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as exc:
            raise DrafterError(f"{index} is not a safetensors index ({exc}); repair it") from None
        return {name: folder / f for name, f in weight_map.items()}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise DrafterError(
            f"target.path: {folder} holds no *.safetensors weights; convert the target to "
            "safetensors (the embedding and lm_head are read from them)"
        )
    out: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open is not a dict
                out.setdefault(name, f)
    return out


def _pick(index: dict[str, Path], names: tuple, suffix: str) -> str | None:
    for n in names:
        if n in index:
            return n
    hits = sorted(n for n in index if n.endswith("." + suffix))
    return hits[0] if len(hits) == 1 else None


def read_target_tensors(folder: str | Path) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(embedding (V, H), lm_head (V, H), config.json) of a HF target, without loading it all."""
    from safetensors import safe_open

    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise DrafterError(f"target.path: {folder} has no config.json; point it at a model folder")
    config = json.loads(cfg_path.read_text())
    text = text_config(config)
    index = _weight_index(folder)
    embed_name = _pick(index, EMBED_NAMES, "embed_tokens.weight")
    if embed_name is None:
        raise DrafterError(
            f"target.path: no input embedding in {folder} (looked for {list(EMBED_NAMES)} and a "
            "unique '*.embed_tokens.weight'); is it a causal LM checkpoint?"
        )
    head_name = _pick(index, HEAD_NAMES, "lm_head.weight")
    tied = bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    if head_name is None and not tied:
        raise DrafterError(
            f"target.path: no lm_head.weight in {folder} and tie_word_embeddings is false; "
            "the checkpoint is incomplete"
        )

    def load(name: str) -> torch.Tensor:
        f = index[name]
        if not f.is_file():
            raise DrafterError(f"target.path: {f} (holding {name}) is missing; re-download it")
        with safe_open(str(f), framework="pt") as st:
            return st.get_tensor(name)

    embed = load(embed_name)
    head = load(head_name) if head_name is not None else embed
    vocab, hidden = int(text["vocab_size"]), int(text["hidden_size"])
    for what, t in (("embedding", embed), ("lm_head", head)):
        if t.ndim != 2 or t.shape[1] != hidden or t.shape[0] < vocab:
            raise DrafterError(
                f"target.path: the {what} in {folder} has shape {tuple(t.shape)}, expected "
                f"({vocab}, {hidden}) from config.json; the folder mixes two models"
            )
    return embed[:vocab], head[:vocab], config


def read_target_norm(folder: str | Path) -> torch.Tensor | None:
    """The target's final norm weight (H,), or None when no tensor is unambiguously it."""
    from safetensors import safe_open

    index = _weight_index(Path(folder))
    name = _pick(index, NORM_NAMES, "norm.weight")
    if name is None or not index[name].is_file():
        return None
    with safe_open(str(index[name]), framework="pt") as st:
        w = st.get_tensor(name)
    return w if w.ndim == 1 else None
