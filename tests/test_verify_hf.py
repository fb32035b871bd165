"""The transformers side of verify_env: layer ids, and finding the decoder layers and the final
norm, checked against HF's own ``output_hidden_states`` on tiny random models."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DeepseekV3Config, LlamaConfig

from eyrie.target.layers import (
    check_aux_layer_ids,
    default_aux_layer_ids,
    find_decoder_layers,
    find_final_norm,
)
from eyrie.verify.hf import check_hf
from eyrie.verify.source import VerifyError
from eyrie.verify.stage import run_stage, write_report


def tiny_llama_config(layers: int = 8) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        architectures=["LlamaForCausalLM"],
    )


def tiny_deepseek_config(layers: int = 8) -> DeepseekV3Config:
    return DeepseekV3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=layers,  # as many experts as layers: a decoy ModuleList of that length
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        first_k_dense_replace=1,
        architectures=["DeepseekV3ForCausalLM"],
    )


@pytest.fixture(params=["llama", "deepseek"])
def tiny(request, tmp_path):
    cfg = tiny_llama_config() if request.param == "llama" else tiny_deepseek_config()
    cfg.save_pretrained(tmp_path)
    return tmp_path, cfg


def test_default_ids():
    assert default_aux_layer_ids(8) == [1, 3, 4]
    assert default_aux_layer_ids(61) == [1, 29, 57]
    assert default_aux_layer_ids(32) == [1, 15, 28]
    with pytest.raises(ValueError, match="capture.aux_layer_ids"):
        default_aux_layer_ids(6)


def test_check_ids_errors():
    assert check_aux_layer_ids((0, 7), 8) == [0, 7]
    with pytest.raises(ValueError, match=r"aux layer id 8 is out of range.*0\.\.7.*aux_layer_ids"):
        check_aux_layer_ids([1, 8], 8)
    with pytest.raises(ValueError, match=r"aux layer id -1 is out of range"):
        check_aux_layer_ids([-1], 8)
    with pytest.raises(ValueError, match=r"aux layer id 3 appears twice.*aux_layer_ids"):
        check_aux_layer_ids([3, 1, 3], 8)
    with pytest.raises(ValueError, match="not an integer"):
        check_aux_layer_ids([True], 8)
    with pytest.raises(ValueError, match="empty"):
        check_aux_layer_ids([], 8)


def test_meta_check_finds_layers_and_norm(tiny):
    folder, cfg = tiny
    res = check_hf(folder)
    assert res["verdict"] == "ok"
    assert res["layers_path"] == "model.layers" and res["num_layers"] == 8
    assert res["norm_path"] == "model.norm"
    assert res["aux_layer_ids"] == [1, 3, 4]
    assert res["aux_modules"] == ["model.layers.1", "model.layers.3", "model.layers.4"]
    assert check_hf(folder / "config.json", [0, 7])["aux_layer_ids"] == [0, 7]


def test_found_modules_match_hf_hidden_states(tiny):
    """Hooks on the found layers and norm reproduce HF's own hidden_states: the output of layer
    i is hidden_states[i + 1] and the norm's output is the last entry."""
    from transformers import AutoModelForCausalLM

    _, cfg = tiny
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    layers_path, layers = find_decoder_layers(model)
    norm_path, norm = find_final_norm(model)
    seen = {}

    def keep(name):
        def hook(_module, _args, output):
            seen[name] = output[0] if isinstance(output, tuple) else output

        return hook

    handles = [layers[i].register_forward_hook(keep(i)) for i in range(len(layers))]
    handles.append(norm.register_forward_hook(keep("norm")))
    ids = torch.randint(0, cfg.vocab_size, (1, 7))
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    for h in handles:
        h.remove()
    hs = out.hidden_states
    assert len(hs) == cfg.num_hidden_layers + 1
    for i in range(cfg.num_hidden_layers - 1):  # the last entry is post-norm in HF
        torch.testing.assert_close(seen[i], hs[i + 1])
    torch.testing.assert_close(seen["norm"], hs[-1])


@pytest.mark.parametrize(
    "ids, pattern",
    [([1, 8], r"out of range.*0\.\.7"), ([2, 2], r"appears twice"), ([0, 100], "100")],
)
def test_bad_ids_name_the_config_key(tiny, ids, pattern):
    folder, _ = tiny
    with pytest.raises(VerifyError, match=pattern) as err:
        check_hf(folder, ids)
    assert "capture.aux_layer_ids" in str(err.value)


def test_missing_or_bad_config(tmp_path):
    with pytest.raises(VerifyError, match="no config.json"):
        check_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no_such_model_type"}))
    with pytest.raises(VerifyError, match="transformers cannot read"):
        check_hf(tmp_path)


def test_stage_hf_backend_writes_report(tiny, tmp_path):
    folder, _ = tiny
    report = run_stage(folder / "config.json", backend="hf", aux_ids=None)
    assert report["ok"] and report["hf"][0]["norm_path"] == "model.norm"
    out = tmp_path / "out"
    write_report(report, out / "report.json", out / "report.md")
    assert json.loads((out / "report.json").read_text())["hf"][0]["num_layers"] == 8
    assert "model.layers" in (out / "report.md").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]


def test_stage_rejects_bad_backend(tiny):
    folder, _ = tiny
    with pytest.raises(VerifyError, match="capture.backend"):
        run_stage(folder, backend="vllm")
