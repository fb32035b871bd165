"""toy-kimi-k25: the Kimi-K2.5 wrapper built by eyrie/target/toy/kimi.py, checked against what
SGLang's source reads and against a plain transformers forward.

SGLang facts are read from the real 0.5.12 release (the verify cache, fetched with pip download;
skipped where that is impossible), by file path and AST: SGLang itself needs CUDA to import, but
its KimiK25Config module imports only transformers, so it is loaded and run on the config.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from eyrie.target.load import TargetError, load_model
from eyrie.target.toy.kimi import build, vision_shapes

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "models" / "toy-llama"
KIMI = "KimiK25ForConditionalGeneration"


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("kimi") / "toy-kimi-k25", TOKENIZER, seed=0, tiny=True)


def _release(version: str):
    from eyrie.verify.source import VerifyError, locate

    try:
        return locate(f"pip:{version}")
    except VerifyError as exc:
        pytest.skip(f"sglang {version} cannot be fetched here: {exc}")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_build_is_deterministic_and_seeded(toy, tmp_path):
    again = build(tmp_path / "again", TOKENIZER, seed=0, tiny=True)
    other = build(tmp_path / "other", TOKENIZER, seed=1, tiny=True)
    assert _sha(again / "model.safetensors") == _sha(toy / "model.safetensors")
    assert (again / "config.json").read_text() == (toy / "config.json").read_text()
    assert _sha(other / "model.safetensors") != _sha(toy / "model.safetensors")


def test_weights_hold_the_language_model_and_every_vision_tensor(toy):
    from safetensors.torch import load_file

    tensors = load_file(str(toy / "model.safetensors"))
    cfg = json.loads((toy / "config.json").read_text())
    vision = {k: v for k, v in tensors.items() if not k.startswith("language_model.")}
    expected = vision_shapes(cfg["vision_config"])
    assert {k: tuple(v.shape) for k, v in vision.items()} == expected
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    layers = cfg["text_config"]["num_hidden_layers"]
    for i in range(layers):
        assert f"language_model.model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight" in tensors
    assert "language_model.lm_head.weight" in tensors


def test_language_model_is_toy_deepseeks_checkpoint_and_loads_into_transformers(toy, tmp_path):
    """The independent reference is toy-deepseek of the same seed, loaded by transformers' own
    from_pretrained: the wrapper's language_model.* tensors must be that checkpoint's tensors,
    name for name and bit for bit (experts one by one, the form SGLang's DeepSeek loader reads;
    the fused module layout of transformers 5 is skipped by SGLang), and Eyrie's loader must
    give the same logits."""
    from safetensors.torch import load_file
    from transformers import DeepseekV3ForCausalLM

    from eyrie.target.toy.deepseek import build as build_deepseek

    ds_dir = build_deepseek(tmp_path / "ds", TOKENIZER, seed=0, tiny=True)
    want = {}
    for f in sorted(ds_dir.glob("*.safetensors")):
        want.update(load_file(str(f)))
    ours_t = {
        k.removeprefix("language_model."): v
        for k, v in load_file(str(toy / "model.safetensors")).items()
        if k.startswith("language_model.")
    }
    assert sorted(ours_t) == sorted(want)
    assert any(".mlp.experts.0.gate_proj.weight" in k for k in ours_t)
    assert all(torch.equal(ours_t[k], want[k]) for k in want)

    text = json.loads((toy / "config.json").read_text())["text_config"]
    ours, arch = load_model(toy, torch.device("cpu"))
    assert arch == KIMI and type(ours).__name__ == "DeepseekV3ForCausalLM"
    ds = DeepseekV3ForCausalLM.from_pretrained(ds_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, text["vocab_size"], (2, 17), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        want_logits = ds(input_ids=ids).logits
        assert torch.equal(ours(input_ids=ids).logits, want_logits)
        assert want_logits.abs().max() > 0


def test_a_foreign_or_missing_tensor_is_refused(toy, tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(toy / "model.safetensors"))
    for case, edit in [
        ("foreign", lambda t: {**t, "audio_tower.w": torch.zeros(2)}),
        ("missing", lambda t: {k: v for k, v in t.items() if "layers.3.input_layernorm" not in k}),
    ]:
        folder = tmp_path / case
        folder.mkdir()
        (folder / "config.json").write_text((toy / "config.json").read_text())
        save_file(edit(tensors), str(folder / "model.safetensors"))
        pattern = "audio_tower.w" if case == "foreign" else "missing.*layers.3.input_layernorm"
        with pytest.raises(TargetError, match=pattern):
            load_model(folder, torch.device("cpu"))


def _config_module(release):
    path = release.package / "srt" / "configs" / "kimi_k25.py"
    spec = importlib.util.spec_from_file_location("sglang_kimi_k25_config", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # imports transformers only
    return mod


def _config_reads(tree: ast.AST, classes: set[str], name: str = "config") -> set[str]:
    """Attributes the __init__ of `classes` read from their `config` argument."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == name
                ):
                    out.add(sub.attr)
    return out


def test_sglang_config_class_parses_the_config_and_has_every_key_read(toy):
    release = _release("0.5.12")
    mod = _config_module(release)
    cfg = mod.KimiK25Config(**json.loads((toy / "config.json").read_text()))
    assert cfg.model_type == "kimi_k25" and type(cfg.text_config).__name__ == "DeepseekV3Config"
    model_src = ast.parse((release.package / "srt" / "models" / "kimi_k25.py").read_text())
    vision_reads = _config_reads(model_src, {"MoonViT3dPretrainedModel", "K2VLMultiModalProjector"})
    assert {"vt_hidden_size", "text_hidden_size", "merge_kernel_size"} <= vision_reads
    missing = sorted(a for a in vision_reads if not hasattr(cfg.vision_config, a))
    assert not missing, f"vision_config lacks {missing}"
    assert cfg.vision_config.text_hidden_size == cfg.text_config.hidden_size
    # deepseek_v2.py reads these from the language model's config (getattr-free reads)
    ds_src = (release.package / "srt" / "models" / "deepseek_v2.py").read_text()
    for key in ("moe_layer_freq", "topk_method", "n_routed_experts", "first_k_dense_replace"):
        assert f"config.{key}" in ds_src
        assert hasattr(cfg.text_config, key), key


def test_vision_tensor_names_fit_sglang_modules(toy):
    """Each vision name, renamed as SGLang 0.5.12's load_weights renames it, must walk through
    attributes that the classes in kimi_k25.py (and the MLP and attention they use) assign."""
    release = _release("0.5.12")
    text = (release.package / "srt" / "models" / "kimi_k25.py").read_text()
    renames = re.findall(r'\.replace\(r?"([\w.]+)",\s*r?"([\w.]+)"\)', text)
    assert ("wqkv.", "attn.qkv_proj.") in renames and len(renames) == 4
    sources = [text, (release.package / "srt" / "models" / "kimi_vl_moonvit.py").read_text()]
    sources.append((release.package / "srt" / "layers" / "attention" / "vision.py").read_text())
    sources.append((release.package / "srt" / "layers" / "conv.py").read_text())
    assigned = {}
    for src in sources:
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ClassDef):
                names = assigned.setdefault(node.name, set())
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                        names.add(sub.attr)
    # the class each attribute path holds, as the __init__ methods build them
    tree = {
        "": KIMI,
        "vision_tower": "MoonViT3dPretrainedModel",
        "vision_tower.patch_embed": "MoonVision3dPatchEmbed",
        "vision_tower.patch_embed.proj": "Conv2dLayer",
        "vision_tower.patch_embed.pos_emb": "Learnable2DInterpPosEmbDivided_fixed",
        "vision_tower.encoder": "MoonViT3dEncoder",
        "vision_tower.encoder.blocks.N": "MoonViTEncoderLayer",
        "vision_tower.encoder.blocks.N.mlp": "MLP2",
        "vision_tower.encoder.blocks.N.attn": "VisionAttention",
        "mm_projector": "K2VLMultiModalProjector",
    }
    cfg = json.loads((toy / "config.json").read_text())
    names = list(vision_shapes(cfg["vision_config"]))
    assert not_fitting(names, renames, tree, assigned) == []
    bad = [n.replace("norm0", "norm_0").replace("fc1", "fc2") for n in names]
    assert len(not_fitting(bad, renames, tree, assigned)) == 4  # the check can fail


def not_fitting(names, renames, tree, assigned) -> list[str]:
    """Names with a step that the class holding it does not assign (leaf modules excepted)."""
    out = []
    for name in names:
        for old, new in renames:
            name = name.replace(old, new)
        parts = re.sub(r"\.\d+\.", ".N.", name).split(".")
        for i, part in enumerate(parts):
            if part == "N":  # an index into a ModuleList
                continue
            cls = tree.get(".".join(parts[:i]))
            if cls is None:  # below a leaf module (nn.LayerNorm, a linear layer): torch's names
                break
            if part not in assigned[cls]:
                out.append(f"{name}: {cls} has no self.{part}")
                break
    return out


def test_verify_names_the_same_chain_and_evidence_as_the_real_release(toy):
    """eyrie verify on the toy's folder against the verdict for the real architecture name
    (61 layers, Kimi-K2.5's): same chain, verdict, patch and file:line evidence per release."""
    from eyrie.sglang.patch.manifest import build_manifest
    from eyrie.verify.stage import check_sglang, run_stage

    keys = ("verdict", "why", "patch", "class", "entry", "capture_path", "layers_holder")
    keys += ("delegation", "shift_rule", "chain", "unresolved")
    for version, verdict in [("0.5.9", "patchable"), ("0.5.12", "ok"), ("0.5.23", "ok")]:
        release = _release(version)
        report = run_stage(toy, "sglang", None, sglang=str(release.root))
        ours = report["sglang"][0]["targets"][0]
        real = check_sglang(release, [KIMI], num_layers=61, aux_ids=[1, 29, 57])["targets"][0]
        assert ours["architecture"] == real["architecture"] == KIMI
        assert ours["verdict"] == verdict, ours["why"]
        for key in keys:
            assert ours[key] == real[key], (version, key)
        assert [lvl["class"] for lvl in ours["chain"]] == [KIMI, "DeepseekV3ForCausalLM"] + [
            "DeepseekV2Model"
        ]
        path = toy.parent / f"report-{version}.json"
        path.write_text(json.dumps(report, default=str))
        m = build_manifest(report, report_path=path, source=release.root)
        assert m["hook_modules"]["aux"] == [f"language_model.model.layers.{i}" for i in (1, 3, 4)]
        assert m["hook_modules"]["final"] == "language_model.model.norm"
        assert m["import_hook"]["holder"] == "language_model.model"
        assert m["call_on"] == ("model.language_model" if version == "0.5.9" else "model")


def test_the_standin_names_modules_as_the_wrapper_does(toy):
    from eyrie.target.wrapped import served_tree

    model, _ = load_model(toy, torch.device("cpu"))
    names = {n for n, _ in served_tree(toy, model).named_modules()}
    assert "language_model.model.layers.3" in names and "language_model.model.norm" in names
    assert "model.layers.3" not in names
