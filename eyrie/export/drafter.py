"""Write a trained drafter in the folder forms SGLang and vLLM load, and check each one.

- ``sglang``: config.json with ``architectures: [LlamaForCausalLMEagle3]``, ``draft_vocab_size``
  and ``eagle_config`` {``eagle_aux_hidden_state_layer_ids``, ``use_aux_hidden_state``}; weights
  ``midlayer.*``, ``fc.weight``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``.
- ``vllm``: the speculators form vLLM detects (``speculators_model_type: eagle3``, the layer's
  Llama config under ``transformer_layer_config``, top-level ``eagle_aux_hidden_state_layer_ids``,
  ``norm_before_residual: false``); weights ``layers.0.*``, the rest as above, and the
  target's input embedding as ``embed_tokens.weight`` (speculators 0.9.0 marks a missing one
  to be copied from the verifier, but under transformers 5 it stays uninitialised).

The target is named in the vLLM config (``speculators_config.verifier.name_or_path``) and in
both folders' eyrie-export.json (``verifier``) by ``export.verifier_name``: a hub id, or, when
null, the target folder's absolute path (a relative one would be taken for a hub id from any
other working directory).

The layer ids written are the ones that make each engine serve the layers the drafter was
trained on (see the table in eyrie/export/check.py). Float weights are cast to ``dtype``; d2t
and t2d keep int64 and bool. A folder is built under a temp name, checked with
eyrie.export.check against the trained weights, and only then renamed into place.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import torch

from eyrie.common import atomic
from eyrie.export import dflash
from eyrie.export.check import (
    EXPORT_META,
    FLOAT_DTYPES,
    SGLANG_ARCH,
    VLLM_ARCH,
    Expectation,
    ExportError,
    config_layer_ids,
    require_ok,
)
from eyrie.train.model import DrafterError
from eyrie.train.saved import read_drafter


def layer_config(meta: dict, dtype: str) -> dict:
    """The Llama config of the drafter's decoder layer, as both engines read it."""
    c, t = meta["config"], meta["target"]
    return {
        "model_type": "llama",
        "hidden_size": c["hidden_size"],
        "intermediate_size": c["intermediate_size"],
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": c["num_key_value_heads"],
        "head_dim": c["head_dim"],
        "num_hidden_layers": 1,
        "hidden_act": c["hidden_act"],
        "rms_norm_eps": c["rms_norm_eps"],
        "max_position_embeddings": c["max_position_embeddings"],
        "rope_theta": c["rope_theta"],
        "rope_parameters": {"rope_type": "default", "rope_theta": c["rope_theta"]},
        "vocab_size": c["vocab_size"],
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": dtype,
        "dtype": dtype,
        **{k: t[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in t},
    }


def sglang_config(meta: dict, ids: list[int], dtype: str) -> dict:
    c = meta["config"]
    return {
        "architectures": [SGLANG_ARCH],
        **layer_config(meta, dtype),
        "draft_vocab_size": c["draft_vocab_size"],
        "target_hidden_size": meta["target"]["hidden_size"],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
    }


def vllm_config(
    meta: dict, ids: list[int], dtype: str, speculative_tokens: int, verifier: str
) -> dict:
    c, t = meta["config"], meta["target"]
    return {
        "architectures": [VLLM_ARCH],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer_config(meta, dtype),
        "draft_vocab_size": c["draft_vocab_size"],
        "norm_before_residual": False,
        "target_hidden_size": t["hidden_size"],
        "eagle_aux_hidden_state_layer_ids": ids,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": int(speculative_tokens),
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": t.get("architectures", [])},
        },
        "torch_dtype": dtype,
    }


def verifier_name(target_dir, configured: str | None) -> str:
    """How the exported configs name the target: the configured name, else its absolute path."""
    if configured:
        return str(configured)
    return str(Path(target_dir).expanduser().resolve())


def target_embedding(target_dir, vocab_size: int, hidden_size: int) -> torch.Tensor:
    """The target's input embedding (vocab, hidden), as the vLLM export ships it."""
    from eyrie.target.tensors import read_target_tensors

    try:
        embed = read_target_tensors(target_dir)[0]
    except DrafterError as exc:
        raise ExportError(
            f"the vllm export ships the target's embedding, read from {target_dir}: {exc}"
        ) from None
    if tuple(embed.shape) != (vocab_size, hidden_size):
        raise ExportError(
            f"the embedding of {target_dir} is {tuple(embed.shape)}; the drafter was trained "
            f"for ({vocab_size}, {hidden_size}): export with the target it was trained on"
        )
    return embed


def engine_weights(
    state: dict, aux_ids: list[int], engine: str, dtype: str, embed: torch.Tensor | None = None
) -> dict:
    """The state dict renamed for the engine, fc's input blocks in ascending layer order, and
    the target's embedding when given."""
    order = sorted(range(len(aux_ids)), key=lambda j: aux_ids[j])
    prefix = "midlayer." if engine == "sglang" else "layers.0."
    state = dict(state) if embed is None else {**state, "embed_tokens.weight": embed}
    out = {}
    for name, t in state.items():
        if name == "fc.weight":
            t = torch.cat([t.chunk(len(aux_ids), dim=1)[j] for j in order], dim=1)
        if name.startswith("midlayer."):
            name = prefix + name[len("midlayer.") :]
        out[name] = (t.to(FLOAT_DTYPES[dtype]) if t.is_floating_point() else t).contiguous()
    return out


def export(
    drafter_dir,
    out_dir,
    engine: str,
    *,
    sglang_rule: str = "plus_one",
    dtype: str = "bfloat16",
    speculative_tokens: int = 3,
    draft_tokens: torch.Tensor | None = None,
    target_dir=None,
    verifier: str | None = None,
) -> dict:
    """Write ``out_dir`` for ``engine`` ('sglang' or 'vllm'); returns its eyrie-export.json.

    ``target_dir`` is the target folder (default: the path the drafter was trained with);
    ``verifier`` the name written for it (export.verifier_name; None: its absolute path)."""
    from safetensors.torch import save_file

    if dtype not in FLOAT_DTYPES:
        raise ExportError(f"export.dtype {dtype!r} is not one of {sorted(FLOAT_DTYPES)}")
    try:
        meta, state = read_drafter(drafter_dir)
    except DrafterError as exc:
        raise ExportError(str(exc)) from None
    trained, target = list(meta["aux_layer_ids"]), meta["target"]
    target_dir = Path(target_dir if target_dir is not None else target["path"])
    name = verifier_name(target_dir, verifier)
    if meta.get("method") == "dflash":
        if engine != "sglang":
            raise ExportError(
                f"{drafter_dir} is a DFlash drafter: its export is written for SGLang only; "
                "set export.engines: [sglang]"
            )
        record = {"engine": engine, "verifier": name, "trained_aux_layer_ids": trained}
        record.update(target=target, train={"steps": meta["train"]["steps"]})
        return dflash.export(drafter_dir, out_dir, meta, state, dtype=dtype, record=record)
    ids = config_layer_ids(trained, engine, sglang_rule, int(target["num_hidden_layers"]))
    embed = None
    if engine == "sglang":
        cfg = sglang_config(meta, ids, dtype)
    else:
        cfg = vllm_config(meta, ids, dtype, speculative_tokens, name)
        c = meta["config"]
        embed = target_embedding(target_dir, int(c["vocab_size"]), int(c["hidden_size"]))
    record = {
        "engine": engine,
        "verifier": name,
        "trained_aux_layer_ids": trained,
        "layer_convention": "output of decoder layer i (0-based)",
        "config_layer_ids": ids,
        "sglang_layer_id_rule": sglang_rule if engine == "sglang" else None,
        "target": target,
        "draft_vocab": meta.get("draft_vocab"),
        "train": {"steps": meta["train"]["steps"], "identity": meta["train"]["identity"]},
        "heldout": meta.get("heldout"),
    }
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.{uuid.uuid4().hex}.tmp")
    tmp.mkdir()
    try:
        weights = engine_weights(state, trained, engine, dtype, embed)
        save_file(weights, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        (tmp / EXPORT_META).write_text(json.dumps(record, indent=2) + "\n")
        require_ok(
            tmp,
            Expectation.of_target(
                engine,
                trained,
                target,
                sglang_rule=sglang_rule,
                draft_tokens=draft_tokens,
                reference=state,
                target_embedding=embed,
            ),
        )
        atomic.replace_folder(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return record
