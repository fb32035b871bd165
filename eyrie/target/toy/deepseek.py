"""Build toy-deepseek: a DeepseekV3ForCausalLM (MLA + MoE) from a seeded random init.

Nothing is shipped: every parameter is drawn from a generator seeded by the seed and the
parameter's name, so the weights depend on neither the library's init order nor the machine.
The default dimensions are ones a real SGLang 0.5.12 server loads; `--tiny` gives a few-MB model
for tests. The tokenizer is toy-llama's, so the shipped dataset and chat template apply as-is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

import torch

from eyrie.common.atomic import replace_folder
from eyrie.target.toy.tokenizer import special_token_ids

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)

# Keys SGLang's deepseek_v2.py reads that transformers' DeepseekV3Config does not write.
SGLANG_KEYS = {
    "moe_layer_freq": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "ep_size": 1,
    "norm_topk_prob": True,
    "num_nextn_predict_layers": 0,
}

# Dimensions per size: (served, tiny). The served ones are what a real SGLang 0.5.12 server
# loads; the tiny ones give a few-MB model for tests.
DIMS = {
    "hidden_size": (1024, 64),
    "num_hidden_layers": (8, 8),
    "num_attention_heads": (16, 4),
    "num_key_value_heads": (16, 4),
    "kv_lora_rank": (512, 32),
    "q_lora_rank": (384, 48),
    "qk_rope_head_dim": (64, 16),
    "qk_nope_head_dim": (128, 16),
    "v_head_dim": (128, 16),
    "intermediate_size": (2816, 128),
    "moe_intermediate_size": (512, 32),
    "n_routed_experts": (16, 8),
    "num_experts_per_tok": (4, 2),
    "n_shared_experts": (1, 1),
    "first_k_dense_replace": (1, 1),
}
SERVED = {k: served for k, (served, _) in DIMS.items()}
TINY = {k: tiny for k, (_, tiny) in DIMS.items()}


def toy_deepseek_config(tokenizer, dims: dict):
    from transformers import DeepseekV3Config

    cfg = DeepseekV3Config(
        vocab_size=len(tokenizer),
        n_group=1,
        topk_group=1,
        routed_scaling_factor=1.0,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        **special_token_ids(tokenizer),
        **dims,
    )
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    return cfg


def seeded_init_(model: torch.nn.Module, seed: int, std: float = 0.02) -> None:
    """Set every parameter to its `seeded_tensor`, so the weights depend on names alone."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(seeded_tensor(seed, name, tuple(p.shape), std))


def seeded_tensor(seed: int, name: str, shape: tuple[int, ...], std: float = 0.02):
    """Norm weights 1, biases 0, anything else drawn from a generator keyed by (seed, name)."""
    if name.endswith(".weight") and ("norm" in name.rsplit(".", 2)[-2]):
        return torch.ones(shape)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    key = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little")
    return torch.randn(shape, generator=torch.Generator().manual_seed(key)) * std


def seeded_model(tokenizer_dir: Path, seed: int, tiny: bool):
    """toy-deepseek's tokenizer, config and seeded DeepseekV3ForCausalLM (float32, CPU)."""
    from transformers import AutoTokenizer, DeepseekV3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    cfg = toy_deepseek_config(tokenizer, TINY if tiny else SERVED)
    with torch.device("cpu"):
        model = DeepseekV3ForCausalLM(cfg)
    seeded_init_(model, seed)
    return tokenizer, cfg, model


def build(out: str | Path, tokenizer_dir: str | Path, seed: int = 0, tiny: bool = False) -> Path:
    out, tokenizer_dir = Path(out), Path(tokenizer_dir)
    _, _, model = seeded_model(tokenizer_dir, seed, tiny)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    config = json.loads((tmp / "config.json").read_text())
    config.update(SGLANG_KEYS)
    config["eyrie_toy"] = {"seed": seed, "tiny": tiny}
    return finish_folder(tmp, out, tokenizer_dir, config)


def finish_folder(tmp: Path, out: Path, tokenizer_dir: Path, config: dict) -> Path:
    """Write config.json and the tokenizer into the folder being built, then put it in place
    of `out` (a toy is rebuilt whole, never half-written over an old one)."""
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy2(tokenizer_dir / name, tmp / name)
    replace_folder(tmp, out)
    return out


def toy_main(build_fn, doc: str, argv=None) -> None:
    """The command line of a toy builder: --out, --tokenizer, --seed, --tiny."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tokenizer", default="models/toy-llama")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="a few-MB model for tests")
    args = p.parse_args(argv)
    print(build_fn(args.out, args.tokenizer, args.seed, args.tiny))


def main(argv=None) -> None:
    toy_main(build, __doc__, argv)


if __name__ == "__main__":
    main()
