"""The shipped targets: toy-llama loads with plain transformers and predicts held-out text;
toy-deepseek builds deterministically with the keys SGLang reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eyrie.target.toy.deepseek import SGLANG_KEYS, build
from eyrie.target.toy.llama import encode_split, evaluate, unigram_baseline
from eyrie.target.toy.tokenizer import read_messages, render

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "models" / "toy-llama"
DATA = ROOT / "data" / "chat"


@pytest.fixture(scope="module")
def toy():
    tok = AutoTokenizer.from_pretrained(TOY, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(TOY, dtype=torch.float32, local_files_only=True)
    return tok, model


def test_toy_llama_is_a_plain_llama_with_gqa(toy):
    _, model = toy
    cfg = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert cfg.num_hidden_layers >= 8
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # grouped-query attention
    weights = sum(p.stat().st_size for p in TOY.glob("*.safetensors"))
    assert weights <= 30 * 2**20


def test_chat_template_matches_the_training_render(toy):
    tok, _ = toy
    for messages in list(read_messages(DATA / "heldout.jsonl"))[:20]:
        assert tok.apply_chat_template(messages, tokenize=False) == render(messages)


def test_toy_llama_beats_unigram_on_heldout_text(toy):
    tok, model = toy
    held = encode_split(tok, DATA / "heldout.jsonl")[: 8 * 512 + 1]
    train = encode_split(tok, DATA / "train.jsonl")
    loss, acc = evaluate(model, held, seq_len=512, batch=8)
    uni_loss, uni_acc = unigram_baseline(train, held, len(tok))
    assert loss < uni_loss - 2.0  # perplexity at least e^2 ~ 7x lower than unigram
    assert acc > 3 * uni_acc


def test_toy_llama_continues_a_known_docstring(toy):
    tok, model = toy
    prompt = [{"role": "user", "content": "What does `os.getcwd` do?"}]
    ids = tok.apply_chat_template(
        prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    out = model.generate(ids, max_new_tokens=24, do_sample=False)
    text = tok.decode(out[0, ids.shape[1] :])
    # Trained answers open with the signature in a code block, qualified by the module's name.
    assert text.startswith("```python\nos.")


def test_toy_deepseek_is_deterministic_and_sglang_ready(tmp_path):
    a = build(tmp_path / "a", TOY, seed=3, tiny=True)
    b = build(tmp_path / "b", TOY, seed=3, tiny=True)
    c = build(tmp_path / "c", TOY, seed=4, tiny=True)
    bytes_a = (a / "model.safetensors").read_bytes()
    assert bytes_a == (b / "model.safetensors").read_bytes()
    assert bytes_a != (c / "model.safetensors").read_bytes()
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    assert all(cfg[k] == v for k, v in SGLANG_KEYS.items())
    model = AutoModelForCausalLM.from_pretrained(a, dtype=torch.float32, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(a, local_files_only=True)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], return_tensors="pt", return_dict=True
    )["input_ids"]
    out = model(input_ids=ids, output_hidden_states=True)
    assert len(out.hidden_states) == cfg["num_hidden_layers"] + 1
    assert torch.isfinite(out.logits).all()
    assert any("kv_a_proj_with_mqa" in n for n, _ in model.named_parameters())  # MLA
    assert any(".experts." in n for n, _ in model.named_parameters())  # MoE
