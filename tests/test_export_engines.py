"""An exported folder against what the engines' own loaders do, re-typed here from their source
independently of eyrie.export.check.

SGLang 0.5.12, python/sglang/srt/models/llama_eagle3.py:
- parameters (lines 44-82, 118-187, 250-282): model.embed_tokens (vocab, H); model.fc
  (H, target_hidden * num_aux), num_aux = len(eagle_config ids) or 3 (153-164); layer 0 with
  qkv_proj on 2H inputs (56-68), o_proj, mlp gate_up/down (78-80), input_layernorm,
  post_attention_layernorm, hidden_norm (82); model.norm (187); lm_head (draft_vocab_size, H)
  when tie_word_embeddings is false (270-282);
- load_weights (293-346): "midlayer" -> "layers.0" by substring (306-316), d2t -> hot token
  ids d2t + arange (318-321), t2d skipped (323-324), q/k/v -> qkv_proj and gate/up ->
  gate_up_proj (296-337), else ``name`` or ``model.`` + name, and anything else silently skipped;
- embed_tokens is replaced by the target's (speculative/eagle_worker.py 177-188);
- layer ids: model_executor/model_runner.py 428-441 reads eagle_config
  ["eagle_aux_hidden_state_layer_ids"]; models/llama.py 798-810 records the input of layer
  id + 1.

vLLM, model_executor/models/llama_eagle3.py: names other than lm_head get ``model.``, d2t
becomes draft_id_to_target_id, t2d is skipped, the same q/k/v and gate/up stacking, fc built
for target_hidden * 3; unknown names raise.
"""

from __future__ import annotations

import json
import re
from importlib import util
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_export import L, V, fake_drafter

from eyrie.export.drafter import export

STACKED = [
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
]


def engine_params(cfg: dict, prefix_model: str) -> dict[str, tuple[int, int] | tuple[int]]:
    """The parameters the engine's Eagle3 Llama model creates, with their shapes."""
    H, inter = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    return {
        f"{prefix_model}embed_tokens.weight": (cfg["vocab_size"], H),
        f"{prefix_model}fc.weight": (H, cfg["_target_hidden"] * cfg["_num_aux"]),
        f"{prefix_model}layers.0.self_attn.qkv_proj.weight": ((nh + 2 * nkv) * hd, 2 * H),
        f"{prefix_model}layers.0.self_attn.o_proj.weight": (H, nh * hd),
        f"{prefix_model}layers.0.mlp.gate_up_proj.weight": (2 * inter, H),
        f"{prefix_model}layers.0.mlp.down_proj.weight": (H, inter),
        f"{prefix_model}layers.0.input_layernorm.weight": (H,),
        f"{prefix_model}layers.0.post_attention_layernorm.weight": (H,),
        f"{prefix_model}layers.0.hidden_norm.weight": (H,),
        f"{prefix_model}norm.weight": (H,),
        "lm_head.weight": (cfg["draft_vocab_size"], H),
    }


def shard_rows(cfg: dict, shard) -> tuple[int, int]:
    H, inter = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    return {
        "q": (0, nh * hd),
        "k": (nh * hd, (nh + nkv) * hd),
        "v": ((nh + nkv) * hd, (nh + 2 * nkv) * hd),
        0: (0, inter),
        1: (inter, 2 * inter),
    }[shard]


def load_like_sglang_0_5_12(folder: Path):
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert not cfg.get("tie_word_embeddings")
    ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    cfg["_num_aux"] = len(ids) if ids else 3
    cfg["_target_hidden"] = cfg.get("target_hidden_size", cfg["hidden_size"])
    params = engine_params(cfg, "model.")
    filled = {name: torch.zeros(shape[0], dtype=torch.bool) for name, shape in params.items()}
    hot, skipped = None, []
    for name, w in load_file(str(folder / "model.safetensors")).items():
        for legacy, new in {"midlayer": "layers.0"}.items():
            if legacy in name:
                name = name.replace(legacy, new)
        if "d2t" in name:
            hot = w + torch.arange(w.shape[0])
            continue
        if "t2d" in name:
            continue
        for param_name, weight_name, shard in STACKED:
            if weight_name not in name:
                continue
            name = name.replace(weight_name, param_name)
            key = f"model.{name}" if name not in params else name
            if key in params:
                lo, hi = shard_rows(cfg, shard)
                assert tuple(w.shape) == (hi - lo, params[key][1]), key
                filled[key][lo:hi] = True
            else:
                skipped.append(name)
            break
        else:
            key = name if name in params else f"model.{name}"
            if key in params:
                assert tuple(w.shape) == params[key], key
                filled[key][:] = True
            else:
                skipped.append(name)
    captured_inputs = [v + 1 for v in ids]  # llama.py:810
    return filled, skipped, hot, captured_inputs


def load_like_vllm(folder: Path):
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3"
    layer = dict(cfg["transformer_layer_config"])
    layer.update(
        draft_vocab_size=cfg["draft_vocab_size"],
        _num_aux=3,
        _target_hidden=cfg.get("target_hidden_size") or layer["hidden_size"],
    )
    params = engine_params(layer, "model.")
    filled = {name: torch.zeros(shape[0], dtype=torch.bool) for name, shape in params.items()}
    hot = None
    for name, w in load_file(str(folder / "model.safetensors")).items():
        if "t2d" in name:
            continue
        if "d2t" in name:
            hot = w + torch.arange(w.shape[0])
            continue
        if "lm_head" not in name:
            name = "model." + name
        name = name.replace("midlayer.", "layers.0.")
        for param_name, weight_name, shard in STACKED:
            if weight_name in name:
                name = name.replace(weight_name, param_name)
                lo, hi = shard_rows(layer, shard)
                assert tuple(w.shape) == (hi - lo, params[name][1]), name  # KeyError: unknown
                filled[name][lo:hi] = True
                break
        else:
            assert tuple(w.shape) == params[name], name  # KeyError: vLLM fails on it
            filled[name][:] = True
    assert cfg["norm_before_residual"] is False
    return filled, hot, list(cfg["eagle_aux_hidden_state_layer_ids"])


def test_sglang_0_5_12_loads_every_parameter(tmp_path):
    d = fake_drafter(tmp_path / "drafter", aux_ids=(1, 3, 5))
    export(d["dir"], tmp_path / "sglang", "sglang")
    filled, skipped, hot, captured = load_like_sglang_0_5_12(tmp_path / "sglang")
    assert skipped == []
    for name, rows in filled.items():
        if name != "model.embed_tokens.weight":  # the target's embedding is put in its place
            assert bool(rows.all()), f"{name} keeps its random init"
    assert torch.equal(hot, d["tokens"]) and int(hot.max()) < V
    assert [c - 1 for c in captured] == [1, 3, 5]  # inputs of layers 2, 4, 6 = outputs of 1, 3, 5
    assert max(captured) < L


def test_vllm_loads_every_parameter(tmp_path):
    d = fake_drafter(tmp_path / "drafter", aux_ids=(1, 3, 5))
    export(d["dir"], tmp_path / "vllm", "vllm")
    filled, hot, ids = load_like_vllm(tmp_path / "vllm")
    for name, rows in filled.items():  # the embedding too: the export ships the target's
        assert bool(rows.all()), f"{name} keeps its random init"
    assert torch.equal(hot, d["tokens"])
    assert [c - 1 for c in ids] == [1, 3, 5]  # vLLM records the input of layer id


def test_a_name_sglang_skips_is_seen_by_the_simulation(tmp_path):
    """The simulation itself can fail: a renamed weight is skipped and its rows stay empty."""
    from safetensors.torch import save_file

    d = fake_drafter(tmp_path / "drafter")
    out = tmp_path / "sglang"
    export(d["dir"], out, "sglang")
    w = load_file(str(out / "model.safetensors"))
    w["draft.norm.weight"] = w.pop("norm.weight")
    save_file(w, str(out / "model.safetensors"))
    filled, skipped, _, _ = load_like_sglang_0_5_12(out)
    assert skipped == ["draft.norm.weight"] and not bool(filled["model.norm.weight"].any())


def sglang_source() -> Path | None:
    spec = util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "srt/models/llama_eagle3.py"
    return path if path.is_file() else None


@pytest.mark.skipif(sglang_source() is None, reason="sglang is not installed")
def test_hard_coded_expectations_match_installed_sglang():
    src = sglang_source().read_text()
    assert re.search(r'"midlayer":\s*"layers\.0"', src)
    for param_name, weight_name, shard in STACKED:
        assert f'("{param_name}", "{weight_name}", {shard!r})'.replace("'", '"') in src
    assert '"d2t" in name' in src and '"t2d" in name' in src
    assert "eagle_aux_hidden_state_layer_ids" in src
