"""Write a trained DFlash drafter in the folder SGLang 0.5.12's DFlash loads, and check it.

config.json: ``architectures: [DFlashDraftModel]``, ``model_type: qwen3`` (only to give
transformers a config class), the layer shape, top-level ``block_size`` and
``num_target_layers``, and ``dflash_config`` {``block_size``, ``target_layer_ids``,
``mask_token_id``}. Weights: ``fc``, ``hidden_norm``, ``layers.i.*``, ``norm``; never the
embedding or lm_head, which SGLang takes from the target.

Layer ids: SGLang's ``set_dflash_layers_to_capture`` adds one to each id and records the input
of that layer, so id i serves the output of decoder layer i, the stores' own convention: the
trained ids are written as they are. SGLang checks only 0 <= id < L, but id L-1 is never
captured (its loop ends before layer L); the check below refuses it. SGLang skips weight names
it does not know without a word, and reads rope_theta as 1e6 from a transformers 5.x config:
the check refuses an unknown or missing name, and a drafter trained at another theta.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import torch

from eyrie.common import atomic
from eyrie.export.check import EXPORT_META, FLOAT_DTYPES, ExportError
from eyrie.train.dflash import SERVED_ROPE_THETA

ARCH = "DFlashDraftModel"
LAYER_WEIGHTS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
)


def weight_names(layers: int) -> set[str]:
    """The names SGLang's DFlashDraftModel.load_weights reads."""
    names = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    return names | {f"layers.{i}.{w}" for i in range(layers) for w in LAYER_WEIGHTS}


def sglang_config(meta: dict, dtype: str) -> dict:
    c, ids = meta["config"], list(meta["aux_layer_ids"])
    block = {"block_size": c["block_size"], "target_layer_ids": ids}
    return {
        "architectures": [ARCH],
        "model_type": "qwen3",
        "hidden_size": c["hidden_size"],
        "intermediate_size": c["intermediate_size"],
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": c["num_key_value_heads"],
        "head_dim": c["head_dim"],
        "num_hidden_layers": c["num_hidden_layers"],
        "hidden_act": c["hidden_act"],
        "rms_norm_eps": c["rms_norm_eps"],
        "attention_bias": False,
        "rope_theta": c["rope_theta"],
        "rope_parameters": {"rope_type": "default", "rope_theta": c["rope_theta"]},
        "max_position_embeddings": c["max_position_embeddings"],
        "vocab_size": c["vocab_size"],
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "block_size": c["block_size"],
        "num_target_layers": int(meta["target"]["num_hidden_layers"]),
        "dflash_config": {**block, "mask_token_id": c["mask_token_id"]},
    }


def problems(folder, meta: dict, reference: dict[str, torch.Tensor]) -> list[str]:
    """What in ``folder`` SGLang would load differently from the trained drafter ``meta``."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    w = load_file(str(folder / "model.safetensors"))
    c, layers = meta["config"], int(meta["target"]["num_hidden_layers"])
    out = []
    if cfg.get("architectures") != [ARCH]:
        out.append(f"architectures is {cfg.get('architectures')}, not [{ARCH}]")
    d = cfg.get("dflash_config") or {}
    ids = d.get("target_layer_ids")
    if ids != list(meta["aux_layer_ids"]):
        out.append(f"target_layer_ids {ids} are not the trained aux layers {meta['aux_layer_ids']}")
    elif ids != sorted(ids) or not all(0 <= i <= layers - 2 for i in ids):
        out.append(
            f"target_layer_ids {ids} must ascend within 0..{layers - 2} (L-1 is not captured)"
        )
    mask = d.get("mask_token_id")
    if not isinstance(mask, int) or not 0 <= mask < int(c["vocab_size"]):
        out.append(f"mask_token_id {mask!r} is not a row of the target's embedding")
    if d.get("block_size") != c["block_size"] or cfg.get("block_size") != c["block_size"]:
        out.append(f"block_size is not the trained {c['block_size']}")
    if float(cfg.get("rope_theta", 0)) != SERVED_ROPE_THETA:
        out.append(f"rope_theta {cfg.get('rope_theta')}: SGLang 0.5.12 serves {SERVED_ROPE_THETA}")
    expected = weight_names(int(c["num_hidden_layers"]))
    if set(w) != expected:
        out.append(
            f"weights: unknown {sorted(set(w) - expected)[:5]}, missing "
            f"{sorted(expected - set(w))[:5]} (SGLang skips unknown names silently)"
        )
    fc = w.get("fc.weight")
    H = int(c["hidden_size"])
    if fc is not None and tuple(fc.shape) != (H, len(meta["aux_layer_ids"]) * H):
        out.append(f"fc.weight is {tuple(fc.shape)}, not ({H}, {len(meta['aux_layer_ids'])} x {H})")
    for name in sorted(set(w) & set(reference)):
        t, ref = w[name].float(), reference[name].float()
        if not torch.isfinite(t).all():
            out.append(f"{name} holds NaN or Inf")
        elif t.shape != ref.shape or not torch.allclose(t, ref.to(w[name].dtype).float()):
            out.append(f"{name} differs from the trained weight")
    return out


def export(drafter_dir, out_dir, meta: dict, state: dict, *, dtype: str, record: dict) -> dict:
    """Write ``out_dir`` for SGLang's DFlash from a trained drafter; returns its record."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.{uuid.uuid4().hex}.tmp")
    tmp.mkdir()
    try:
        weights = {n: t.to(FLOAT_DTYPES[dtype]).contiguous() for n, t in state.items()}
        save_file(weights, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(sglang_config(meta, dtype), indent=2) + "\n")
        record = {**record, "method": "dflash", "config_layer_ids": list(meta["aux_layer_ids"])}
        (tmp / EXPORT_META).write_text(json.dumps(record, indent=2) + "\n")
        found = problems(tmp, meta, state)
        if found:
            raise ExportError(
                f"the DFlash export of {drafter_dir} would not serve the trained drafter: "
                + "; ".join(found)
            )
        atomic.replace_folder(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return record
