"""Build toy-kimi-k25: a KimiK25ForConditionalGeneration folder from a seeded random init.

Kimi-K2.5 is a multimodal wrapper (a MoonViT vision tower and a patch-merging projector around
a DeepSeek-V3 language model). Its SGLang class must pass EAGLE-3's capture switch on to the
language model it holds; this toy lets that chain be served and captured at toy scale.

The language model is toy-deepseek's (same dimensions, same seeded init, so for a given seed its
tensors equal toy-deepseek's), stored under `language_model.`. The vision tower and projector
are tiny but complete: every tensor SGLang 0.5.12's `KimiK25ForConditionalGeneration.load_weights`
maps onto its modules is written, under the checkpoint names of the real release
(`wqkv`/`wo`, `mm_projector.proj.0`/`.2`, which SGLang renames as it loads). config.json has
`model_type: kimi_k25` (the type SGLang's `KimiK25Config` registers), the language model's
DeepseekV3 keys in `text_config` (with the keys SGLang's deepseek_v2.py reads) and the vision
keys SGLang's modules read in `vision_config`. Prompts are text only.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from eyrie.target.toy.deepseek import (
    SGLANG_KEYS,
    finish_folder,
    seeded_model,
    seeded_tensor,
    toy_main,
)
from eyrie.target.toy.tokenizer import special_token_ids

ARCHITECTURE = "KimiK25ForConditionalGeneration"
MODEL_TYPE = "kimi_k25"
LANGUAGE_PREFIX = "language_model."
WEIGHTS = "model.safetensors"

# The vision tower and projector: tiny, but shaped as SGLang builds them. Rope2DPosEmbRepeated
# needs hidden_size / num_attention_heads divisible by 4; the projector merges 2x2 patches.
VISION = dict(
    patch_size=14,
    init_pos_emb_height=4,
    init_pos_emb_width=4,
    init_pos_emb_time=4,
    pos_emb_type="divided_fixed",
    num_attention_heads=2,
    num_hidden_layers=1,
    hidden_size=32,
    intermediate_size=64,
    merge_kernel_size=[2, 2],
    video_attn_type="spatial_temporal",
    merge_type="sd2_tpool",
    mm_projector_type="patchmerger",
    projector_hidden_act="gelu",
    projector_ln_eps=1e-5,
)


def vision_config(text_hidden: int) -> dict:
    """vision_config as SGLang reads it, plus the `vt_*` names the real release's config uses
    (the projector reads `vt_hidden_size`; the tower reads `hidden_size`)."""
    v = dict(VISION)
    v.update(
        mm_hidden_size=v["hidden_size"],
        text_hidden_size=text_hidden,
        vt_hidden_size=v["hidden_size"],
        vt_num_attention_heads=v["num_attention_heads"],
        vt_num_hidden_layers=v["num_hidden_layers"],
        vt_intermediate_size=v["intermediate_size"],
    )
    return v


def vision_shapes(v: dict) -> dict[str, tuple[int, ...]]:
    """Every vision tensor, named as the checkpoint names it (SGLang 0.5.12's load_weights maps
    `wqkv.` to `attn.qkv_proj.`, `wo.` to `attn.proj.`, `mm_projector.proj.0/2` to
    `mm_projector.linear_1/2`, and refuses a name its modules lack)."""
    h, inter, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    kh, kw = v["merge_kernel_size"]
    merged = h * kh * kw
    out: dict[str, tuple[int, ...]] = {
        "vision_tower.patch_embed.proj.weight": (h, 3, p, p),
        "vision_tower.patch_embed.proj.bias": (h,),
        "vision_tower.patch_embed.pos_emb.weight": (
            v["init_pos_emb_height"],
            v["init_pos_emb_width"],
            h,
        ),
    }
    for i in range(v["num_hidden_layers"]):
        b = f"vision_tower.encoder.blocks.{i}."
        out.update(
            {
                b + "norm0.weight": (h,),
                b + "norm0.bias": (h,),
                b + "norm1.weight": (h,),
                b + "norm1.bias": (h,),
                b + "wqkv.weight": (3 * h, h),
                b + "wqkv.bias": (3 * h,),
                b + "wo.weight": (h, h),
                b + "wo.bias": (h,),
                b + "mlp.fc0.weight": (inter, h),
                b + "mlp.fc0.bias": (inter,),
                b + "mlp.fc1.weight": (h, inter),
                b + "mlp.fc1.bias": (h,),
            }
        )
    out.update(
        {
            "vision_tower.encoder.final_layernorm.weight": (h,),
            "vision_tower.encoder.final_layernorm.bias": (h,),
            "mm_projector.pre_norm.weight": (h,),
            "mm_projector.pre_norm.bias": (h,),
            "mm_projector.proj.0.weight": (merged, merged),
            "mm_projector.proj.0.bias": (merged,),
            "mm_projector.proj.2.weight": (v["text_hidden_size"], merged),
            "mm_projector.proj.2.bias": (v["text_hidden_size"],),
        }
    )
    return out


def build(out: str | Path, tokenizer_dir: str | Path, seed: int = 0, tiny: bool = False) -> Path:
    from safetensors.torch import load_file, save_file

    out, tokenizer_dir = Path(out), Path(tokenizer_dir)
    tokenizer, text_cfg, lm = seeded_model(tokenizer_dir, seed, tiny)
    # The language model's tensors as a checkpoint names them (save_pretrained writes
    # DeepSeek-V3's experts one by one), the form SGLang's loader reads; the module layout of
    # the transformers at hand (fused experts) would be skipped by SGLang without a word.
    with tempfile.TemporaryDirectory() as saved:
        lm.to(torch.bfloat16).save_pretrained(saved, safe_serialization=True)
        tensors = {}
        for f in sorted(Path(saved).glob("*.safetensors")):
            tensors.update({LANGUAGE_PREFIX + k: v for k, v in load_file(str(f)).items()})
    vision = vision_config(text_cfg.hidden_size)
    for name, shape in vision_shapes(vision).items():
        tensors[name] = seeded_tensor(seed, name, shape).to(torch.bfloat16).contiguous()

    text = text_cfg.to_diff_dict()  # the keys toy-deepseek's own config.json has
    text.update(SGLANG_KEYS)
    text["architectures"] = ["DeepseekV3ForCausalLM"]
    for key in ("transformers_version", "dtype", "torch_dtype"):
        text.pop(key, None)
    config = {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "text_config": text,
        "vision_config": vision,
        "ignore_index": -100,
        # No image is ever sent; the placeholder id only has to be a valid token id.
        "media_placeholder_token_id": len(tokenizer) - 1,
        "use_unified_vision_chunk": False,
        **special_token_ids(tokenizer),
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "eyrie_toy": {"seed": seed, "tiny": tiny, "language_model_of": "toy-deepseek"},
    }

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
    return finish_folder(tmp, out, tokenizer_dir, config)


def main(argv=None) -> None:
    toy_main(build, __doc__, argv)


if __name__ == "__main__":
    main()
