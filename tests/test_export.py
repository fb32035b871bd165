"""Exports for SGLang and vLLM: layer-id conventions, and the checker accepting a good folder
and refusing each kind of bad one."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eyrie.export.check import (
    Expectation,
    ExportError,
    check_export,
    config_layer_ids,
    served_layers,
)
from eyrie.export.drafter import export
from eyrie.train.model import Drafter, DrafterConfig

L, H, V, N = 8, 32, 96, 40


def fake_drafter(folder: Path, aux_ids=(1, 3, 4), seed=0, target: Path | None = None) -> dict:
    """A drafter folder as eyrie train writes it (random weights, a real draft vocabulary), for
    a fake target of L layers, hidden H and vocabulary V, or for the HF folder ``target``."""
    layers, hidden, vocab = L, H, V
    if target is not None:
        t = json.loads((Path(target) / "config.json").read_text())
        layers, hidden, vocab = t["num_hidden_layers"], t["hidden_size"], t["vocab_size"]
    cfg = DrafterConfig(
        hidden_size=hidden,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_aux=len(aux_ids),
        vocab_size=vocab,
        draft_vocab_size=N,
    )
    torch.manual_seed(seed)
    model = Drafter(cfg)
    tokens = torch.sort(torch.randperm(vocab)[:N]).values
    model.set_vocab(
        tokens - torch.arange(N), torch.zeros(vocab, dtype=torch.bool).index_fill(0, tokens, True)
    )
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(folder / "model.safetensors"),
    )
    meta = {
        "format": "eyrie-drafter",
        "version": 1,
        "config": cfg.to_dict(),
        "aux_layer_ids": list(aux_ids),
        "layer_convention": "output",
        "target": {
            "path": "models/x",
            "architectures": ["LlamaForCausalLM"],
            "num_hidden_layers": layers,
            "hidden_size": hidden,
            "vocab_size": vocab,
        },
        "draft_vocab": {"path": "v", "sha256": "0"},
        "train": {"steps": 1, "identity": "x", "settings": {}},
        "heldout": None,
    }
    if target is None:  # a fake target: config.json, and the embedding and lm_head read
        target = folder.parent / f"{folder.name}-target"
        target.mkdir(exist_ok=True)
        embed = torch.randn(V, H, generator=torch.Generator().manual_seed(seed + 1))
        save_file(
            {"model.embed_tokens.weight": embed, "lm_head.weight": embed.flip(0).contiguous()},
            str(target / "model.safetensors"),
        )
        (target / "config.json").write_text(json.dumps(meta["target"]))
    else:
        embed = load_file(str(Path(target) / "model.safetensors"))["model.embed_tokens.weight"]
    meta["target"]["path"] = str(target)
    (folder / "drafter.json").write_text(json.dumps(meta))
    return {
        "dir": folder,
        "tokens": tokens,
        "state": model.state_dict(),
        "aux": list(aux_ids),
        "target": target,
        "embed": embed,
    }


def expectation(engine, d, **kw) -> Expectation:
    base = dict(
        engine=engine,
        aux_layer_ids=d["aux"],
        target_num_layers=L,
        target_hidden_size=H,
        target_vocab_size=V,
        draft_tokens=d["tokens"],
    )
    base.update(kw)
    return Expectation(**base)


# ---------------------------------------------------------------------------------------------
# layer ids


def sglang_0_5_12_capture(config_ids):
    """sglang 0.5.12 srt/models/llama.py:810 (and deepseek_v2.py:2541), re-typed: the layers
    whose input is recorded; the input of layer c is the output of layer c - 1."""
    return [val + 1 for val in config_ids]


def sglang_0_5_23_deepseek_capture(config_ids):
    """sglang 0.5.23 srt/models/deepseek_v2.py:3470-3473, re-typed."""
    if config_ids and config_ids[0] == 1:
        return [val + 1 for val in config_ids]
    return list(config_ids)


def vllm_capture(config_ids):
    """vLLM: aux layer idx records ``hidden_states + residual`` before layer idx runs."""
    return list(config_ids)


@pytest.mark.parametrize(
    "trained, engine, rule, written, capture",
    [
        ([1, 3, 4], "sglang", "plus_one", [1, 3, 4], sglang_0_5_12_capture),
        ([0, 2, 5], "sglang", "plus_one", [0, 2, 5], sglang_0_5_12_capture),
        ([1, 3, 4], "sglang", "plus_one_if_first_is_1", [1, 3, 4], sglang_0_5_23_deepseek_capture),
        ([2, 3, 5], "sglang", "plus_one_if_first_is_1", [3, 4, 6], sglang_0_5_23_deepseek_capture),
        ([1, 3, 4], "sglang", "as_is", [2, 4, 5], vllm_capture),
        ([1, 3, 4], "vllm", "plus_one", [2, 4, 5], vllm_capture),
        ([4, 1, 3], "vllm", "plus_one", [2, 4, 5], vllm_capture),  # written ascending
    ],
)
def test_layer_ids_per_engine(trained, engine, rule, written, capture):
    ids = config_layer_ids(trained, engine, rule, L)
    assert ids == written
    # what the engine's own code does with them: the outputs of exactly the trained layers
    assert sorted(c - 1 for c in capture(ids)) == sorted(trained)
    assert served_layers(ids, engine, rule) == sorted(trained)


def test_layer_ids_that_no_config_can_serve():
    with pytest.raises(ExportError, match="last decoder layer"):
        config_layer_ids([1, 3, L - 1], "sglang", "plus_one", L)
    with pytest.raises(ExportError, match="last decoder layer"):
        config_layer_ids([1, 3, L - 1], "vllm", "plus_one", L)
    with pytest.raises(ExportError, match="layer 0"):
        config_layer_ids([0, 3, 4], "sglang", "plus_one_if_first_is_1", L)


# ---------------------------------------------------------------------------------------------
# a good export


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_export_writes_a_folder_the_checker_accepts(tmp_path, engine):
    d = fake_drafter(tmp_path / "drafter", aux_ids=(4, 1, 3))
    out = tmp_path / engine
    record = export(d["dir"], out, engine, draft_tokens=d["tokens"])
    assert check_export(out, expectation(engine, d, reference=d["state"])) == []
    cfg = json.loads((out / "config.json").read_text())
    w = load_file(str(out / "model.safetensors"))
    if engine == "sglang":
        assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
        assert cfg["eagle_config"] == {
            "eagle_aux_hidden_state_layer_ids": [1, 3, 4],
            "use_aux_hidden_state": True,
        }
        assert cfg["draft_vocab_size"] == N and cfg["tie_word_embeddings"] is False
        assert any(n.startswith("midlayer.") for n in w)
    else:
        assert cfg["speculators_model_type"] == "eagle3"
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
        assert cfg["norm_before_residual"] is False
        assert cfg["transformer_layer_config"]["num_hidden_layers"] == 1
        assert any(n.startswith("layers.0.") for n in w)
    assert record["trained_aux_layer_ids"] == [4, 1, 3]
    assert w["d2t"].dtype == torch.int64 and w["t2d"].dtype == torch.bool
    assert w["lm_head.weight"].dtype == torch.bfloat16
    assert torch.equal(w["d2t"] + torch.arange(N), d["tokens"])
    # the engine feeds aux states in layer order (1, 3, 4); the trained fc read (4, 1, 3)
    aux = torch.randn(5, 3, H)  # slots in the trained order
    trained = d["state"]["fc.weight"] @ aux.flatten(1).T
    engine_order = aux[:, [1, 2, 0]]  # layers 1, 3, 4
    served = w["fc.weight"].float() @ engine_order.flatten(1).T
    torch.testing.assert_close(served, trained.bfloat16().float(), rtol=0.02, atol=0.02)
    # a rerun replaces the folder
    export(d["dir"], out, engine)
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".")) == []


def test_an_exported_folder_is_readable_by_other_users(tmp_path):
    old = os.umask(0o022)
    try:
        d = fake_drafter(tmp_path / "drafter", aux_ids=(4, 1, 3))
        export(d["dir"], tmp_path / "sglang", "sglang", draft_tokens=d["tokens"])
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "sglang").iterdir()}
    assert modes["model.safetensors"] == 0o644, modes  # safetensors alone writes 0600
    assert set(modes.values()) == {0o644}
    assert stat.S_IMODE((tmp_path / "sglang").stat().st_mode) == 0o755


def test_vllm_export_ships_the_targets_embedding(tmp_path):
    d = fake_drafter(tmp_path / "drafter")
    for dtype in ("bfloat16", "float32"):
        out = tmp_path / f"vllm-{dtype}"
        export(d["dir"], out, "vllm", dtype=dtype)
        w = load_file(str(out / "model.safetensors"))["embed_tokens.weight"]
        assert w.dtype == getattr(torch, dtype) and torch.equal(w, d["embed"].to(w.dtype))
    sglang = tmp_path / "sglang"
    export(d["dir"], sglang, "sglang")  # SGLang takes the target's own embedding in its place
    assert "embed_tokens.weight" not in load_file(str(sglang / "model.safetensors"))


def test_targets_embedding_missing_or_other_is_refused(tmp_path):
    d, out = good_folder(tmp_path, "vllm")
    e = expectation("vllm", d, target_embedding=d["embed"])
    assert check_export(out, e) == []
    edit_weights(out, lambda w: w.__setitem__("embed_tokens.weight", torch.zeros(V, H).bfloat16()))
    assert check_export(out, e) == [
        "weight 'embed_tokens.weight' differs from the target's embedding"
    ]
    edit_weights(out, lambda w: w.pop("embed_tokens.weight"))
    refused(out, d, "vllm", r"'embed_tokens.weight' is missing")
    # a target other than the one trained on (another hidden size) is refused at export
    narrow = torch.zeros(V, 16)
    save_file({"model.embed_tokens.weight": narrow, "lm_head.weight": narrow.clone()},
              str(d["target"] / "model.safetensors"))  # fmt: skip
    config = json.loads((d["target"] / "config.json").read_text())
    (d["target"] / "config.json").write_text(json.dumps({**config, "hidden_size": 16}))
    with pytest.raises(ExportError, match=r"embedding of .* is \(96, 16\); .* \(96, 32\)"):
        export(d["dir"], tmp_path / "other", "vllm")


def test_exports_name_the_target_by_absolute_path_or_the_configured_name(tmp_path, monkeypatch):
    d = fake_drafter(tmp_path / "drafter")
    monkeypatch.chdir(tmp_path)
    for engine in ("sglang", "vllm"):
        export(d["dir"], tmp_path / engine, engine, target_dir=Path("drafter-target"))
        record = json.loads((tmp_path / engine / "eyrie-export.json").read_text())
        assert record["verifier"] == str(tmp_path.resolve() / "drafter-target")
    cfg = json.loads((tmp_path / "vllm" / "config.json").read_text())
    name = cfg["speculators_config"]["verifier"]["name_or_path"]
    assert name == str(tmp_path.resolve() / "drafter-target") and Path(name).is_absolute()
    export(d["dir"], tmp_path / "hub", "vllm", target_dir="drafter-target", verifier="org/Model-8B")
    cfg = json.loads((tmp_path / "hub" / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "org/Model-8B"
    record = json.loads((tmp_path / "hub" / "eyrie-export.json").read_text())
    assert record["verifier"] == "org/Model-8B"


# ---------------------------------------------------------------------------------------------
# bad exports are refused


def good_folder(tmp_path, engine):
    d = fake_drafter(tmp_path / "drafter")
    out = tmp_path / engine
    export(d["dir"], out, engine, draft_tokens=d["tokens"])
    return d, out


def edit_config(folder, fn):
    p = folder / "config.json"
    cfg = json.loads(p.read_text())
    fn(cfg)
    p.write_text(json.dumps(cfg))


def edit_weights(folder, fn):
    p = folder / "model.safetensors"
    w = load_file(str(p))
    fn(w)
    save_file(w, str(p))


def refused(folder, d, engine, pattern, **kw):
    problems = check_export(folder, expectation(engine, d, **kw))
    assert any(re.search(pattern, p) for p in problems), problems


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_missing_layer_ids_refused(tmp_path, engine):
    d, out = good_folder(tmp_path, engine)
    if engine == "sglang":
        edit_config(out, lambda c: c["eagle_config"].pop("eagle_aux_hidden_state_layer_ids"))
    else:
        edit_config(out, lambda c: c.pop("eagle_aux_hidden_state_layer_ids"))
    refused(out, d, engine, "silently")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_layer_ids_in_the_other_convention_refused(tmp_path, engine):
    d, out = good_folder(tmp_path, engine)
    wrong = [1, 3, 4] if engine == "vllm" else [2, 4, 5]
    if engine == "sglang":
        edit_config(out, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=wrong))
    else:
        edit_config(out, lambda c: c.update(eagle_aux_hidden_state_layer_ids=wrong))
    refused(out, d, engine, r"serve the outputs of layers")


def test_sglang_rule_mismatch_refused(tmp_path):
    d, out = good_folder(tmp_path, "sglang")  # written for plus_one
    refused(out, d, "sglang", "serve the outputs", sglang_rule="as_is")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_unknown_weight_name_refused(tmp_path, engine):
    d, out = good_folder(tmp_path, engine)
    edit_weights(out, lambda w: w.update({"decoder.fc.weight": w.pop("fc.weight")}))
    refused(out, d, engine, "'decoder.fc.weight' is not one")
    refused(out, d, engine, "'fc.weight' is missing")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_wrong_shape_refused(tmp_path, engine):
    d, out = good_folder(tmp_path, engine)
    edit_weights(out, lambda w: w.update({"lm_head.weight": w["lm_head.weight"][:-1].clone()}))
    refused(out, d, engine, r"lm_head.weight' has shape \(39, 32\)")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_inconsistent_vocab_maps_refused(tmp_path, engine):
    d, out = good_folder(tmp_path, engine)

    def flip(w):  # same count of marked tokens, but one that d2t does not map to
        t2d = w["t2d"].clone()
        marked, unmarked = int(torch.nonzero(t2d)[0]), int(torch.nonzero(~t2d)[0])
        t2d[marked], t2d[unmarked] = False, True
        w["t2d"] = t2d

    edit_weights(out, flip)
    refused(out, d, engine, "vocab maps: t2d")

    d, out = good_folder(tmp_path / "b", engine)
    edit_weights(out, lambda w: w.update({"d2t": w["d2t"] + V}))
    refused(out, d, engine, "outside the target vocabulary")

    d, out = good_folder(tmp_path / "c", engine)
    edit_weights(out, lambda w: w.update({"d2t": w["d2t"].float()}))  # the blanket-cast bug
    refused(out, d, engine, "must be int64")


def test_draft_vocab_other_than_trained_refused(tmp_path):
    d, out = good_folder(tmp_path, "sglang")
    other = torch.sort(torch.randperm(V)[:N]).values
    refused(out, d, "sglang", "trained with", draft_tokens=other)


def test_sglang_silent_fallbacks_refused(tmp_path):
    d, out = good_folder(tmp_path, "sglang")
    edit_config(out, lambda c: c.update(tie_word_embeddings=True))
    refused(out, d, "sglang", "tie_word_embeddings")
    edit_config(out, lambda c: c.update(tie_word_embeddings=False, fc_norm=True))
    refused(out, d, "sglang", "fc_norm")
    edit_config(out, lambda c: (c.pop("fc_norm"), c.pop("draft_vocab_size")))
    refused(out, d, "sglang", "draft_vocab_size is missing")


def test_vllm_norm_before_residual_default_refused(tmp_path):
    d, out = good_folder(tmp_path, "vllm")
    edit_config(out, lambda c: c.pop("norm_before_residual"))
    refused(out, d, "vllm", "norm_before_residual")


def test_weights_other_than_trained_refused(tmp_path):
    d, out = good_folder(tmp_path, "vllm")
    edit_weights(out, lambda w: w.update({"norm.weight": w["norm.weight"] * 2}))
    refused(out, d, "vllm", "differs from the trained", reference=d["state"])


def test_four_aux_layers_refused(tmp_path):
    d = fake_drafter(tmp_path / "drafter", aux_ids=(1, 2, 3, 4))
    with pytest.raises(ExportError, match="exactly 3"):
        export(d["dir"], tmp_path / "out", "sglang")
    assert not (tmp_path / "out").exists()  # nothing published


def test_check_export_cli(tmp_path, capsys):
    from eyrie.cli.main import main

    d, out = good_folder(tmp_path, "sglang")
    assert main(["check-export", str(out), "--engine", "sglang"]) == 0
    edit_config(out, lambda c: c.pop("eagle_config"))
    assert main(["check-export", str(out), "--engine", "sglang"]) == 1
    err = capsys.readouterr().err
    assert "REFUSED" in err and "silently" in err


def test_trained_drafter_exports_for_both_engines(tmp_path):
    """Train two steps on stores of a real (tiny) target, export, and check both folders
    against the store's own aux ids and the target's config, as the workflow does."""
    from test_train_setup import make_setup, tiny_settings

    from eyrie.store.shard import ShardReader
    from eyrie.train.trainer import train
    from eyrie.train.vocab import load as load_vocab

    s = make_setup(tmp_path, n_train=8, n_heldout=2)
    out = tmp_path / "train"
    train(
        train_stores=s["train"],
        heldout_stores=s["heldout"],
        target_dir=s["target"],
        vocab_path=s["vocab"],
        out_dir=out,
        settings=tiny_settings(max_steps=2),
        progress=False,
    )
    target = json.loads((s["target"] / "config.json").read_text())
    tokens = load_vocab(s["vocab"]).draft_tokens
    for engine in ("sglang", "vllm"):
        export(out / "drafter", tmp_path / engine, engine, draft_tokens=tokens)
        expect = Expectation(
            engine=engine,
            aux_layer_ids=ShardReader(s["train"][0]).aux_layer_ids,
            target_num_layers=target["num_hidden_layers"],
            target_hidden_size=target["hidden_size"],
            target_vocab_size=target["vocab_size"],
            draft_tokens=tokens,
            reference=load_file(str(out / "drafter" / "model.safetensors")),
        )
        assert check_export(tmp_path / engine, expect) == []
