"""Tiny targets for tests: a BPE tokenizer with the toy chat template and random small models.

Everything is built in a temporary folder from a fixed seed, in well under a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIALS = ["<pad>", "<s>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CORPUS = [
    "Hello there! How are you today? I am fine, thank you.",
    "The quick brown fox jumps over the lazy dog.",
    "What is two plus two? Two plus two is four.",
    "Tell me a story about a bird that flies over the mountains at night.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 and symbols ,.;:!?()[]{}",
]


def conversation(i: int, turns: int = 1) -> list[dict]:
    """A deterministic conversation whose length grows with i."""
    msgs = [{"role": "system", "content": f"Be brief, case {i}."}] if i % 3 == 0 else []
    for t in range(turns):
        words = " ".join(CORPUS[(i + t + k) % len(CORPUS)] for k in range(1 + (i + t) % 4))
        msgs.append({"role": "user", "content": f"Question {i}.{t}: {words[: 20 + 7 * i]}"})
        msgs.append(
            {"role": "assistant", "content": f"Answer {i}.{t}: {words[::-1][: 15 + 5 * i]}"}
        )
    return msgs


def build_tokenizer(out: str | Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="<|end|>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
    )
    hf.save_pretrained(out)
    return hf


def build_llama(out: str | Path, layers: int = 6, hidden: int = 32, seed: int = 0) -> Path:
    """A random LlamaForCausalLM with the test tokenizer, saved as safetensors."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out)
    tok = build_tokenizer(out)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    _widen(model)
    model.save_pretrained(out)
    return out


def build_deepseek(out: str | Path, seed: int = 0) -> Path:
    """A random DeepseekV3ForCausalLM (MLA + MoE), a few hundred kB."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    out = Path(out)
    tok = build_tokenizer(out)
    cfg = DeepseekV3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=5,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        kv_lora_rank=16,
        q_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        max_position_embeddings=1024,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(cfg)
    _widen(model)
    model.save_pretrained(out)
    return out


def _widen(model) -> None:
    """Larger weights than the default init, so every layer changes its input visibly."""
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.2)


def write_split(path: str | Path, n: int, turns: int = 1) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"s{i:03d}", "messages": conversation(i, turns)}) + "\n")
    return path
