"""Refuse a drafter folder that an engine would load wrongly without saying so.

SGLang skips weight names it does not know, falls back to default aux layers when the config
holds none, and reads layer ids with a per-release shift; vLLM reads another config form and
another id convention. Each of those turns a good drafter into ~0 % acceptance with no error.
This module states what each engine reads, as data, and checks a folder against it.

Layer ids. Eyrie's aux id i is the output of decoder layer i. Both engines record the hidden
state *entering* some layer c (``hidden + residual`` before layer c runs), i.e. the output of
layer c-1. What c is for a config id x:

=========================================  ===================  =============  ==============
engine, release                            config key           c for id x     id we write
=========================================  ===================  =============  ==============
SGLang 0.5.12 all models, 0.5.23 Llama,    eagle_config.eagle_  x + 1          i
Qwen, Gemma, GLM-4-MoE, ... (plus_one)     aux_hidden_state_
                                           layer_ids
SGLang 0.5.23 DeepseekV2/V3, Kimi-K2.5,    same                 x + 1 if ids   i if i_0 = 1,
GLM-4-MoE-Lite                                                  [0] == 1 else  else i + 1
(``plus_one_if_first_is_1``)                                    x              (i_0 = 0: none)
(``as_is``)                                same                 x              i + 1
vLLM (speculators or plain config)         eagle_aux_hidden_    x              i + 1
                                           state_layer_ids
                                           (top level)
=========================================  ===================  =============  ==============

c must lie in 1..L-1: the engines never record after the last layer, so the output of layer
L-1 cannot be served as an aux state. Captured states are concatenated in layer order, so the
ids are written ascending (the exporter permutes fc's input blocks to match).

Sources read: sglang 0.5.12 python/sglang/srt/models/llama_eagle3.py (LlamaForCausalLMEagle3:
weights, ``load_weights`` lines 293-346, legacy ``midlayer`` -> ``layers.0``, skips unknown
names), srt/models/llama.py ``set_eagle3_layers_to_capture`` (lines 798-810),
srt/model_executor/model_runner.py (lines 428-441: ids from the draft config's
``eagle_config``, defaults when absent), srt/speculative/eagle_info.py ``hidden_size_for``
(3 aux states unless the target says otherwise); sglang 0.5.23 srt/models/deepseek_v2.py
(lines 3458-3473); vLLM model_executor/models/llama_eagle3.py (fc built for 3 aux states,
``norm_before_residual``, names without ``model.``, ``d2t`` -> ``draft_id_to_target_id``) and
transformers_utils/configs/speculators (``norm_before_residual`` defaults to true there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eyrie.common.errors import EyrieError
from eyrie.train.vocab import check_maps

ENGINES = ("sglang", "vllm")
SGLANG_RULES = ("plus_one", "as_is", "plus_one_if_first_is_1")
NUM_AUX = 3  # both engines size their aux buffers / fc for three captured states
SGLANG_ARCH = "LlamaForCausalLMEagle3"
VLLM_ARCH = "Eagle3Speculator"
EXPORT_META = "eyrie-export.json"
FLOAT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# config keys whose true value selects weights or math the drafter was not trained with
SGLANG_UNTRAINED_FLAGS = ("fc_norm", "use_aux_norm", "norm_before_fc", "norm_output", "bias")


class ExportError(EyrieError, ValueError):
    """An export the engine would misread; the message lists every problem found."""


# ---------------------------------------------------------------------------------------------
# layer ids


def captured_inputs(config_ids: list[int], engine: str, rule: str = "plus_one") -> list[int]:
    """The layers c whose *input* the engine records for the ids written in the config."""
    ids = [int(x) for x in config_ids]
    if engine == "vllm":
        return ids
    if engine != "sglang":
        raise ExportError(f"engine {engine!r} is not one of {ENGINES}")
    if rule == "plus_one":
        return [x + 1 for x in ids]
    if rule == "as_is":
        return ids
    if rule == "plus_one_if_first_is_1":
        return [x + 1 for x in ids] if ids and ids[0] == 1 else ids
    raise ExportError(f"export.sglang_layer_id_rule {rule!r} is not one of {SGLANG_RULES}")


def served_layers(config_ids: list[int], engine: str, rule: str = "plus_one") -> list[int]:
    """The layers (output-of-layer convention) the engine feeds the drafter, in feed order."""
    return sorted(c - 1 for c in captured_inputs(config_ids, engine, rule))


def config_layer_ids(trained: list[int], engine: str, rule: str, num_layers: int) -> list[int]:
    """The ids to write so the engine serves exactly the ``trained`` layers (output of layer i).

    Raises ExportError when no config can do it (a last-layer id, or 0 under the DeepSeek rule).
    """
    want = sorted(int(i) for i in trained)
    if want and want[-1] >= num_layers - 1:
        raise ExportError(
            f"aux layer {want[-1]} is the output of the target's last decoder layer "
            f"(L = {num_layers}); serving engines record the input of layer i+1 and there is "
            "none. Extract with capture.aux_layer_ids below "
            f"{num_layers - 1}"
        )
    if engine == "vllm" or rule == "as_is":
        ids = [i + 1 for i in want]
    elif rule == "plus_one":
        ids = list(want)
    elif rule == "plus_one_if_first_is_1":
        if want and want[0] == 0:
            raise ExportError(
                "aux layer 0 cannot be expressed for SGLang's plus_one_if_first_is_1 rule "
                "(id 0 reads the embeddings, id 1 is shifted to layer 2); extract without layer 0"
            )
        ids = list(want) if want and want[0] == 1 else [i + 1 for i in want]
    else:
        raise ExportError(f"export.sglang_layer_id_rule {rule!r} is not one of {SGLANG_RULES}")
    if served_layers(ids, engine, rule) != want:  # the round trip is the definition
        raise ExportError(f"no {engine} layer ids serve layers {want} under rule {rule}")
    return ids


# ---------------------------------------------------------------------------------------------
# what each engine loads


def expected_weights(
    engine: str,
    *,
    hidden: int,
    target_hidden: int,
    num_aux: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    draft_vocab: int,
    vocab: int,
) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, kind) of every tensor the engine loads; kind is 'float', 'int64', 'bool'."""
    layer = "midlayer" if engine == "sglang" else "layers.0"
    f = "float"
    return {
        "fc.weight": ((hidden, num_aux * target_hidden), f),
        f"{layer}.input_layernorm.weight": ((hidden,), f),
        f"{layer}.hidden_norm.weight": ((hidden,), f),
        f"{layer}.post_attention_layernorm.weight": ((hidden,), f),
        f"{layer}.self_attn.q_proj.weight": ((heads * head_dim, 2 * hidden), f),
        f"{layer}.self_attn.k_proj.weight": ((kv_heads * head_dim, 2 * hidden), f),
        f"{layer}.self_attn.v_proj.weight": ((kv_heads * head_dim, 2 * hidden), f),
        f"{layer}.self_attn.o_proj.weight": ((hidden, heads * head_dim), f),
        f"{layer}.mlp.gate_proj.weight": ((intermediate, hidden), f),
        f"{layer}.mlp.up_proj.weight": ((intermediate, hidden), f),
        f"{layer}.mlp.down_proj.weight": ((hidden, intermediate), f),
        "norm.weight": ((hidden,), f),
        "lm_head.weight": ((draft_vocab, hidden), f),
        "d2t": ((draft_vocab,), "int64"),
        "t2d": ((vocab,), "bool"),
        # speculators 0.9.0 leaves a missing one uninitialised under transformers 5
        **({"embed_tokens.weight": ((vocab, hidden), f)} if engine == "vllm" else {}),
    }


# names an engine accepts but Eyrie never writes: tolerated, not required
OPTIONAL_WEIGHTS = {"sglang": ("embed_tokens.weight",), "vllm": ()}


@dataclass
class Expectation:
    """What the folder must serve: the trained layers and the target it was trained on."""

    engine: str
    aux_layer_ids: list[int]  # trained, output of layer i, in the drafter's fc order
    target_num_layers: int
    target_hidden_size: int
    target_vocab_size: int
    sglang_rule: str = "plus_one"
    draft_tokens: torch.Tensor | None = None  # the trained draft vocabulary, when known
    reference: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    target_embedding: torch.Tensor | None = field(default=None, repr=False)  # the target's own

    @classmethod
    def of_target(cls, engine: str, aux_layer_ids, target: dict, **more) -> Expectation:
        """From the target's sizes: its config.json's text_config, or an export's record."""
        return cls(
            engine=engine,
            aux_layer_ids=list(aux_layer_ids),
            target_num_layers=int(target["num_hidden_layers"]),
            target_hidden_size=int(target["hidden_size"]),
            target_vocab_size=int(target["vocab_size"]),
            **more,
        )


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files (a drafter is small)."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    out: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            if name in out:
                raise ExportError(f"{folder}: tensor {name} appears in two files")
            out[name] = t
    return out


# ---------------------------------------------------------------------------------------------
# the checks


def _layer_config(cfg: dict, engine: str) -> dict:
    """The Llama keys of the decoder layer: nested in the vLLM (speculators) form."""
    if engine == "vllm":
        return cfg.get("transformer_layer_config") or {}
    return cfg


def _config_problems(cfg: dict, e: Expectation) -> tuple[list[str], list[int] | None]:
    p: list[str] = []
    if e.engine == "sglang":
        if cfg.get("architectures") != [SGLANG_ARCH]:
            p.append(
                f"architectures is {cfg.get('architectures')!r}, SGLang needs [{SGLANG_ARCH!r}]"
            )
        eagle = cfg.get("eagle_config")
        ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
        if not isinstance(eagle, dict) or "eagle_aux_hidden_state_layer_ids" not in eagle:
            p.append(
                "eagle_config.eagle_aux_hidden_state_layer_ids is missing: SGLang silently "
                "captures its default layers [2, L//2, L-3] instead of the trained ones"
            )
            ids = None
        elif eagle.get("use_aux_hidden_state", True) is not True:
            p.append(
                "eagle_config.use_aux_hidden_state must be true (the drafter fuses aux states)"
            )
        if cfg.get("tie_word_embeddings", False):
            p.append(
                "tie_word_embeddings is true: SGLang then uses the embedding as lm_head and "
                "silently skips lm_head.weight"
            )
        for key in SGLANG_UNTRAINED_FLAGS:
            if cfg.get(key) or (isinstance(eagle, dict) and eagle.get(key)):
                p.append(f"{key} is set: SGLang would add math the drafter was not trained with")
        if cfg.get("target_hidden_size", e.target_hidden_size) != cfg.get("hidden_size"):
            p.append(
                "target_hidden_size differs from hidden_size: SGLang would not share the embedding"
            )
    else:
        if cfg.get("speculators_model_type") != "eagle3":
            p.append("speculators_model_type must be 'eagle3' for vLLM's speculators loader")
        if not isinstance(cfg.get("transformer_layer_config"), dict):
            p.append("transformer_layer_config (the decoder layer's Llama config) is missing")
        if cfg.get("norm_before_residual") is not False:
            p.append(
                "norm_before_residual must be written as false: vLLM's speculators loader "
                "defaults it to true, a residual the drafter was not trained with"
            )
        ids = cfg.get("eagle_aux_hidden_state_layer_ids")
        if ids is None:
            p.append(
                "eagle_aux_hidden_state_layer_ids (top level) is missing: vLLM silently uses its "
                "default layers (2, L//2, L-3)"
            )
        spec = cfg.get("speculators_config") or {}
        methods = spec.get("proposal_methods") or [{}]
        if not isinstance(methods[0].get("speculative_tokens"), int):
            p.append("speculators_config.proposal_methods[0].speculative_tokens is missing")
        if not (spec.get("verifier") or {}).get("name_or_path"):
            p.append("speculators_config.verifier.name_or_path is missing")
        if cfg.get("target_hidden_size", e.target_hidden_size) != e.target_hidden_size:
            p.append(f"target_hidden_size must be the target's hidden size {e.target_hidden_size}")
    layer = _layer_config(cfg, e.engine)
    if layer.get("num_hidden_layers") != 1:
        p.append(
            f"num_hidden_layers is {layer.get('num_hidden_layers')!r}; the drafter has 1 layer"
        )
    if layer.get("hidden_size") != e.target_hidden_size:
        p.append(
            f"hidden_size {layer.get('hidden_size')!r} differs from the target's "
            f"{e.target_hidden_size}: the target embedding cannot be shared"
        )
    if layer.get("vocab_size") != e.target_vocab_size:
        p.append(
            f"vocab_size {layer.get('vocab_size')!r} is not the target's {e.target_vocab_size}"
        )
    if not isinstance(cfg.get("draft_vocab_size"), int):
        p.append(
            "draft_vocab_size is missing: the engines then size lm_head for the full vocabulary "
            "(SGLang even loads the target's lm_head instead of the drafter's)"
        )
    if layer.get("attention_bias") or layer.get("mlp_bias"):
        p.append("attention_bias / mlp_bias are set: the drafter has no biases")
    if ids is not None and not (isinstance(ids, list) and all(type(x) is int for x in ids)):
        p.append(f"layer ids {ids!r} must be a list of integers")
        ids = None
    return p, ids


def _layer_id_problems(ids: list[int], e: Expectation) -> list[str]:
    p = []
    if len(ids) != NUM_AUX or len(e.aux_layer_ids) != NUM_AUX:
        p.append(
            f"{len(ids)} layer ids in the config, {len(e.aux_layer_ids)} trained: both engines "
            f"size the aux input for exactly {NUM_AUX} states (SGLang eagle_info.hidden_size_for, "
            "vLLM llama_eagle3 fc); extract with three capture.aux_layer_ids"
        )
    if ids != sorted(ids):
        p.append(f"layer ids {ids} are not ascending; engines feed captured states in layer order")
    captured = captured_inputs(ids, e.engine, e.sglang_rule)
    bad = [c for c in captured if not 1 <= c <= e.target_num_layers - 1]
    if bad:
        p.append(
            f"{e.engine} would record the input of layer(s) {bad}, outside "
            f"1..{e.target_num_layers - 1} for a {e.target_num_layers}-layer target: those "
            "states never arrive"
        )
    served = served_layers(ids, e.engine, e.sglang_rule)
    if served != sorted(e.aux_layer_ids):
        rule = f" under SGLang rule {e.sglang_rule}" if e.engine == "sglang" else ""
        p.append(
            f"config ids {ids} make {e.engine}{rule} serve the outputs of layers {served}, but the "
            f"drafter was trained on layers {sorted(e.aux_layer_ids)}"
        )
    return p


def _weight_problems(w: dict[str, torch.Tensor], cfg: dict, e: Expectation) -> list[str]:
    p = []
    layer = _layer_config(cfg, e.engine)
    try:
        want = expected_weights(
            e.engine,
            hidden=int(layer["hidden_size"]),
            target_hidden=e.target_hidden_size,
            num_aux=len(e.aux_layer_ids),
            heads=int(layer["num_attention_heads"]),
            kv_heads=int(layer.get("num_key_value_heads") or layer["num_attention_heads"]),
            head_dim=int(
                layer.get("head_dim") or layer["hidden_size"] // layer["num_attention_heads"]
            ),
            intermediate=int(layer["intermediate_size"]),
            draft_vocab=int(cfg.get("draft_vocab_size") or 0),
            vocab=e.target_vocab_size,
        )
    except (KeyError, TypeError, ValueError) as exc:
        return [f"config lacks a shape key ({exc}); cannot tell what the engine builds"]
    dtype_name = str(cfg.get("torch_dtype") or layer.get("torch_dtype") or "bfloat16")
    float_dtype = FLOAT_DTYPES.get(dtype_name)
    skipped = "SGLang silently skips it" if e.engine == "sglang" else "vLLM fails on it"
    for name in sorted(set(w) - set(want) - set(OPTIONAL_WEIGHTS[e.engine])):
        p.append(f"weight {name!r} is not one {e.engine} loads ({skipped})")
    for name, (shape, kind) in want.items():
        if name not in w:
            p.append(f"weight {name!r} is missing ({e.engine} would keep its random init)")
            continue
        t = w[name]
        if tuple(t.shape) != shape:
            p.append(f"weight {name!r} has shape {tuple(t.shape)}, {e.engine} builds {shape}")
        if kind == "int64" and t.dtype != torch.int64:
            p.append(
                f"{name} is {t.dtype}; it must be int64 (token ids do not survive a float cast)"
            )
        elif kind == "bool" and t.dtype != torch.bool:
            p.append(f"{name} is {t.dtype}; it must be bool")
        elif kind == "float":
            if float_dtype is not None and t.dtype != float_dtype:
                p.append(f"weight {name!r} is {t.dtype}, config says {dtype_name}")
            if t.is_floating_point() and not torch.isfinite(t.float()).all():
                p.append(f"weight {name!r} holds NaN or Inf")
    if "d2t" in w and "t2d" in w:
        p += [f"vocab maps: {x}" for x in check_maps(w["d2t"], w["t2d"], e.target_vocab_size)]
        if cfg.get("draft_vocab_size") not in (None, w["d2t"].numel()):
            p.append(
                f"draft_vocab_size {cfg.get('draft_vocab_size')} != d2t length {w['d2t'].numel()}"
            )
        if e.draft_tokens is not None and w["d2t"].dtype == torch.int64:
            mapped = w["d2t"] + torch.arange(w["d2t"].numel())
            if not torch.equal(mapped, e.draft_tokens.to(torch.int64)):
                p.append("d2t does not map to the draft vocabulary the drafter was trained with")
    return p


def _reference_problems(w: dict[str, torch.Tensor], e: Expectation) -> list[str]:
    """Exported tensors equal the trained ones (renamed, fc blocks in layer order, cast)."""
    p = []
    order = sorted(range(len(e.aux_layer_ids)), key=lambda j: e.aux_layer_ids[j])
    prefix = "midlayer." if e.engine == "sglang" else "layers.0."
    for name, ref in e.reference.items():
        out_name = prefix + name[len("midlayer.") :] if name.startswith("midlayer.") else name
        if out_name not in w:
            continue  # reported as missing already
        got = w[out_name]
        if name == "fc.weight":
            ref = torch.cat(list(ref.chunk(len(order), dim=1)[j] for j in order), dim=1)
        if got.shape != ref.shape:
            continue
        if ref.is_floating_point():
            same = torch.equal(got, ref.to(got.dtype))
        else:
            same = torch.equal(got, ref)
        if not same:
            p.append(f"weight {out_name!r} differs from the trained drafter's {name!r}")
    return p


def check_export(folder, e: Expectation) -> list[str]:
    """Every reason the engine would load ``folder`` as something other than the trained drafter."""
    folder = Path(folder)
    if e.engine not in ENGINES:
        raise ExportError(f"engine {e.engine!r} is not one of {ENGINES}")
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        return [f"{folder}/config.json is missing"]
    except ValueError as exc:
        return [f"{folder}/config.json is not JSON: {exc}"]
    problems, ids = _config_problems(cfg, e)
    if ids is not None:
        problems += _layer_id_problems(ids, e)
    weights = read_weights(folder)
    if not weights:
        return problems + [f"{folder} holds no *.safetensors weights"]
    problems += _weight_problems(weights, cfg, e)
    if e.reference is not None:
        problems += _reference_problems(weights, e)
    got = weights.get("embed_tokens.weight")
    ref = e.target_embedding
    if got is not None and ref is not None and got.shape == ref.shape:
        if not torch.equal(got, ref.to(got.dtype)):
            problems.append("weight 'embed_tokens.weight' differs from the target's embedding")
    return problems


def require_ok(folder, e: Expectation) -> None:
    problems = check_export(folder, e)
    if problems:
        lines = "\n".join(f"  - {x}" for x in problems)
        raise ExportError(f"{folder} would not serve the trained drafter on {e.engine}:\n{lines}")
