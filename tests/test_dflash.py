"""DFlash: the batched multi-anchor forward against a block decoded the way SGLang serves it,
the labels of each slot, and a short training run on real stores."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_train import read_metrics
from test_train_setup import AUX, make_setup, tiny_settings

from eyrie.export.check import ExportError
from eyrie.export.dflash import problems, weight_names
from eyrie.export.drafter import export
from eyrie.train.dflash import DFlashConfig, DFlashDrafter, draft_logits
from eyrie.train.dflash_loss import eligible, every_anchor, sample_anchors, slot_labels
from eyrie.train.trainer import train

H, K, V, B = 32, 3, 50, 4


def tiny(layers=2) -> DFlashDrafter:
    torch.manual_seed(0)
    cfg = DFlashConfig(
        hidden_size=H,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_hidden_layers=layers,
        num_aux=K,
        vocab_size=V,
        block_size=B,
        mask_token_id=7,
        rope_theta=10000.0,
    )
    model = DFlashDrafter(cfg).double()
    with torch.no_grad():  # norms away from 1, so that a skipped or misplaced norm shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def rms(x, w, eps):
    return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope(x, pos, theta):
    """x (heads, d) at one position, rotate-half layout."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.cat([pos * inv, pos * inv])
    rot = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * ang.cos() + rot * ang.sin()


def served_block(model, aux, ids, a, embed):
    """One block as SGLang's DFlash serves it: the context rows' keys and values cached token
    by token (no input norm on them), then the block [x_a, M, ...] at a.. a+B-1 attending to
    all cached rows and to all of its own slots. Loops and plain matmuls only."""
    cfg, eps = model.config, model.config.rms_norm_eps
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    fused = [model.fc.weight @ aux[j].reshape(-1) for j in range(a)]
    ctx = [rms(f, model.hidden_norm.weight, eps) for f in fused]
    h = embed(torch.tensor([ids[a]] + [cfg.mask_token_id] * (B - 1)))
    for layer in model.layers:
        at = layer.self_attn

        def kv(x, pos, at=at):
            k = (at.k_proj.weight @ x).view(nkv, hd)
            k = rope(rms(k, at.k_norm.weight, eps), pos, cfg.rope_theta)
            return k, (at.v_proj.weight @ x).view(nkv, hd)

        cached = [kv(c, j) for j, c in enumerate(ctx)]
        x = [rms(h[i], layer.input_layernorm.weight, eps) for i in range(B)]
        block = [kv(x[i], a + i) for i in range(B)]
        keys = cached + block
        out = []
        for i in range(B):
            q = rope(
                rms((at.q_proj.weight @ x[i]).view(nh, hd), at.q_norm.weight, eps),
                a + i,
                cfg.rope_theta,
            )
            heads = []
            for n in range(nh):
                g = n // (nh // nkv)
                s = torch.stack([q[n] @ k[g] for k, _ in keys]) / math.sqrt(hd)
                p = torch.softmax(s, 0)
                heads.append(sum(p[j] * keys[j][1][g] for j in range(len(keys))))
            out.append(at.o_proj.weight @ torch.cat(heads))
        h = h + torch.stack(out)
        m = layer.mlp
        y = rms(h, layer.post_attention_layernorm.weight, eps)
        gated = torch.nn.functional.silu(y @ m.gate_proj.weight.T) * (y @ m.up_proj.weight.T)
        h = h + gated @ m.down_proj.weight.T
    return rms(h, model.norm.weight, eps)


def test_batched_blocks_equal_the_served_block_and_see_only_their_context():
    model = tiny()
    T = 12
    torch.manual_seed(1)
    aux = torch.randn(1, T, K, H, dtype=torch.float64)
    ids = torch.randint(0, V, (1, T))
    table = torch.randn(V, H, dtype=torch.float64)

    def embed(x):
        return table[x]

    anchors = torch.tensor([[2, 5, 9, -1]])
    out = model(aux, ids, anchors, embed)
    for n, a in enumerate([2, 5, 9]):
        ref = served_block(model, aux[0], ids[0].tolist(), a, embed)
        torch.testing.assert_close(out[0, n], ref, rtol=1e-9, atol=1e-9)
    # a block alone gives what it gives among others; later context rows change nothing
    alone = model(aux, ids, torch.tensor([[5]]), embed)
    torch.testing.assert_close(alone[0, 0], out[0, 1])
    later = aux.clone()
    later[:, 5:] += torch.randn_like(later[:, 5:])
    torch.testing.assert_close(model(later, ids, torch.tensor([[5]]), embed)[0, 0], out[0, 1])
    # ...but an earlier one does, and so does the anchor's token
    earlier = aux.clone()
    earlier[:, 4] += 1.0
    assert not torch.allclose(model(earlier, ids, torch.tensor([[5]]), embed)[0, 0], out[0, 1])


def test_heldout_terms_in_anchor_chunks_equal_one_pass_over_every_anchor():
    """Held-out scoring computes the labels and the context keys once per batch and runs the
    anchors a chunk at a time: the sums are those of one pass over every anchor, sharing
    nothing."""
    from types import SimpleNamespace

    from eyrie.train.dflash_loss import block_terms
    from eyrie.train.method import heldout_terms

    model = tiny()
    g = torch.Generator().manual_seed(1)
    T = 12
    embed_w = torch.randn(V, H, generator=g, dtype=torch.float64)
    head = SimpleNamespace(lm_head=torch.randn(V, H, generator=g, dtype=torch.float64),
                           embed=lambda x: embed_w[x])  # fmt: skip
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, 8:] = 0  # a shorter answer: its row has fewer anchors (-1 pads)
    batch = {
        "aux_hidden": torch.randn(2, T, K, H, generator=g, dtype=torch.float64),
        "input_ids": torch.randint(0, V, (2, T), generator=g),
        "final_hidden": torch.randn(2, T, H, generator=g, dtype=torch.float64),
        "loss_mask": mask,
    }
    settings = {"method": "dflash", "dflash": {"anchors": 3}}
    with torch.no_grad():
        chunked = heldout_terms(model, head, batch, settings, None)
        whole = block_terms(model, head, batch, every_anchor(eligible(mask)), None)
    whole.pop("accepted")
    assert chunked.keys() == whole.keys()
    for key, value in whole.items():
        assert torch.allclose(chunked[key].double(), value.double(), atol=1e-9), key
    assert float(whole["counts"][0]) == 10 + 6  # anchors 1..10 of row 0, 1..6 of row 1


def test_slot_k_is_scored_on_the_target_token_at_anchor_plus_k():
    T = 10
    greedy = torch.arange(100, 100 + T)[None]  # greedy[t]: the target's token at t + 1
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 0, 0]])
    label, scored = slot_labels(greedy, mask, torch.tensor([[3, 6, -1]]), B)
    # anchor 3: slots 1..3 are positions 4, 5, 6, predicted by the target at 3, 4, 5
    assert label[0, 0].tolist() == [103, 104, 105] and scored[0, 0].tolist() == [True] * 3
    # anchor 6: position 7 is an answer token, 8 and 9 are not
    assert label[0, 1, 0] == 106 and scored[0, 1].tolist() == [True, False, False]
    assert not scored[0, 2].any()
    ok = eligible(mask)
    assert ok[0].nonzero().flatten().tolist() == [3, 4, 5, 6]
    assert every_anchor(ok).tolist() == [[3, 4, 5, 6]]
    drawn = sample_anchors(ok, 3, torch.Generator().manual_seed(0))
    assert drawn.shape == (1, 3) and set(drawn[0].tolist()) <= {3, 4, 5, 6}
    assert drawn[0].tolist() == sorted(drawn[0].tolist())
    padded = sample_anchors(ok, 6, torch.Generator().manual_seed(0))
    assert padded[0].tolist()[:4] == [3, 4, 5, 6] and padded[0, 4:].tolist() == [-1, -1]


def test_draft_logits_read_slots_after_the_first_through_the_target_head():
    hidden = torch.randn(2, 3, B, H)
    head = torch.randn(V, H)
    logits = draft_logits(hidden, head)
    assert logits.shape == (2, 3, B - 1, V)
    torch.testing.assert_close(logits[1, 2, 0], head @ hidden[1, 2, 1])


SETTINGS = dict(
    max_steps=12, method="dflash", lr=3e-3, dflash={"block_size": 4, "layers": 1, "anchors": 8}
)


def test_dflash_trains_from_the_same_stores_and_scores_every_slot(tmp_path):
    s = make_setup(tmp_path)
    out = tmp_path / "train"
    settings = tiny_settings(**SETTINGS)
    summary = train(
        train_stores=s["train"],
        heldout_stores=s["heldout"],
        target_dir=s["target"],
        vocab_path=s["vocab"],
        out_dir=out,
        settings=settings,
        progress=False,
    )
    rows = read_metrics(out / "metrics.csv")
    assert len(rows) == 12 and "acc_2" in rows[0] and "acc_3" not in rows[0]
    first = sum(float(r["loss"]) for r in rows[:3])
    last = sum(float(r["loss"]) for r in rows[-3:])
    assert last < first, (first, last)
    held = summary["heldout"]
    assert len(held["acc"]) == 3 and held["scored"][0] >= held["scored"][2] > 0
    assert all(c <= a + 1e-12 for c, a in zip(held["chain_acc"], held["acc"], strict=True))
    meta = json.loads((out / "drafter" / "drafter.json").read_text())
    assert meta["method"] == "dflash" and meta["config"]["block_size"] == 4
    # the exact resume holds for drawn anchors too: the same run again draws the same blocks
    again = train(
        train_stores=s["train"],
        heldout_stores=s["heldout"],
        target_dir=s["target"],
        vocab_path=s["vocab"],
        out_dir=tmp_path / "again",
        settings=settings,
        progress=False,
    )
    assert again["heldout"] == held


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash")
    s = make_setup(root)
    train(
        train_stores=s["train"],
        heldout_stores=[],
        target_dir=s["target"],
        vocab_path=s["vocab"],
        out_dir=root / "train",
        settings=tiny_settings(**{**SETTINGS, "max_steps": 2}),
        progress=False,
    )
    return root / "train" / "drafter"


def test_export_writes_what_sglangs_dflash_loads(trained, tmp_path):
    out = tmp_path / "sglang"
    record = export(trained, out, "sglang", dtype="float32")
    cfg = json.loads((out / "config.json").read_text())
    meta = json.loads((trained / "drafter.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and record["method"] == "dflash"
    # id i is the output of layer i in the store and in SGLang (+1, then a layer's input)
    assert cfg["dflash_config"]["target_layer_ids"] == meta["aux_layer_ids"] == AUX
    assert cfg["num_target_layers"] == 6 and cfg["block_size"] == 4
    weights = load_file(str(out / "model.safetensors"))
    assert set(weights) == weight_names(1)
    assert not any("embed" in n or "lm_head" in n for n in weights)
    assert problems(out, meta, load_file(str(trained / "model.safetensors"))) == []
    with pytest.raises(ExportError, match="SGLang only"):
        export(trained, tmp_path / "vllm", "vllm")


@pytest.mark.parametrize("shift", [-1, 1])
def test_the_check_refuses_target_layers_off_by_one(trained, tmp_path, shift):
    out = tmp_path / "sglang"
    export(trained, out, "sglang", dtype="float32")
    cfg = json.loads((out / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [i + shift for i in AUX]
    (out / "config.json").write_text(json.dumps(cfg))
    meta = json.loads((trained / "drafter.json").read_text())
    found = problems(out, meta, load_file(str(trained / "model.safetensors")))
    assert any("target_layer_ids" in p for p in found), found


def test_the_check_refuses_a_name_sglang_would_skip(trained, tmp_path):
    out = tmp_path / "sglang"
    export(trained, out, "sglang", dtype="float32")
    w = load_file(str(out / "model.safetensors"))
    w["layers.0.self_attn.qkv.weight"] = w.pop("layers.0.self_attn.q_proj.weight")
    save_file(w, str(out / "model.safetensors"))
    meta = json.loads((trained / "drafter.json").read_text())
    found = problems(out, meta, load_file(str(trained / "model.safetensors")))
    assert any("unknown" in p and "qkv" in p for p in found), found


@pytest.fixture(scope="module")
def loop_pair(tmp_path_factory):
    from tiny_target import build_llama
    from transformers import AutoModelForCausalLM

    from eyrie.evaluate.block_runner import BlockRunner
    from eyrie.evaluate.target_runner import Target

    folder = build_llama(tmp_path_factory.mktemp("loop") / "t", layers=6, hidden=32)
    cfg = json.loads((folder / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    target = Target(model, [1, 2, 3])
    torch.manual_seed(0)
    dcfg = DFlashConfig.from_target(
        cfg, num_aux=3, dflash={"layers": 1, "block_size": B}, overrides=None
    )
    drafter = DFlashDrafter(dcfg)
    runner = BlockRunner(drafter, target.embed, model.get_output_embeddings().weight)
    yield target, runner
    target.close()


def test_a_proposed_block_is_the_batched_forward_at_that_anchor(loop_pair):
    target, runner = loop_pair
    prompt = [1, 200, 13, 99, 54, 3, 3, 18]
    _, aux = target.forward(prompt, target.new_cache())
    runner.reset()
    runner.extend(aux[:, :5], prompt[1:6], 0)  # rows 0..4 verified, x_5 the last token
    drafts = runner.propose(B - 1)
    with torch.no_grad():
        out = runner.d(aux, torch.tensor([prompt]), torch.tensor([[5]]), target.embed)
    want = draft_logits(out, runner.lm_head)[0, 0].argmax(-1).tolist()
    assert drafts == want
    assert runner.propose(2) == want[:2]
    with pytest.raises(Exception, match="block_size - 1"):
        runner.propose(B)


class ForcedBlocks:
    """The real runner drafts (and caches), but its drafts become the true continuation with
    the one at ``wrong(step)`` corrupted: a known acceptance to verify against."""

    def __init__(self, runner, sequence, wrong):
        self.r, self.sequence, self.wrong, self.steps = runner, sequence, wrong, 0

    def __getattr__(self, name):
        return getattr(self.r, name)

    def propose(self, n):
        self.r.propose(n)
        at = self.r.length  # the last verified token sits at position `at`
        drafts = list(self.sequence[at + 1 : at + 1 + n]) + [0] * n
        w = self.wrong(self.steps)
        if w < n:
            drafts[w] = (drafts[w] + 1) % 50 + 3
        self.steps += 1
        return drafts[:n]


def test_block_decoding_is_plain_greedy_and_accepts_what_it_should(loop_pair):
    from test_speculate import reference_greedy

    from eyrie.evaluate.speculate import greedy_generate, speculative_generate

    target, runner = loop_pair
    for prompt in ([1, 40, 41, 42], [1, 200, 13, 99, 54, 3, 3, 3, 18]):
        want = reference_greedy(target.model, prompt, 30)
        assert greedy_generate(target, prompt, 30).tokens == want
        assert speculative_generate(target, runner, prompt, B - 1, 30).tokens == want
        forced = ForcedBlocks(runner, prompt + want + [0] * 8, wrong=lambda s: s % (B + 1))
        spec = speculative_generate(target, forced, prompt, B - 1, 30)
        assert spec.tokens == want
        expect = [min(s % (B + 1), B - 1) for s in range(len(spec.accepted))]
        assert spec.accepted[:-1] == expect[:-1]
        # the context cache after the run equals one extend from scratch
        full = prompt + spec.tokens
        rows = min(runner.length, len(full) - 1)
        _, aux = target.forward(full[:rows], target.new_cache())
        fresh = type(runner)(runner.d, runner.embed, runner.lm_head)
        fresh.extend(aux, full[1 : rows + 1], 0)
        for (k, v), (fk, fv) in zip(runner.kv, fresh.kv, strict=True):
            torch.testing.assert_close(k[:, :rows], fk, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(v[:, :rows], fv, atol=1e-5, rtol=1e-5)


def test_offline_acceptance_of_a_block_is_the_batched_forward_per_anchor(trained, tmp_path):
    from eyrie.evaluate.acceptance import block_drafts, count_acceptance, load_drafter
    from eyrie.target.greedy import greedy_tokens
    from eyrie.target.tensors import read_target_tensors

    drafter, meta = load_drafter(trained)
    target_dir = meta["target"]["path"]
    embed_w, lm_head, _ = read_target_tensors(target_dir)
    torch.manual_seed(0)
    T = 9
    aux = torch.randn(1, T, 3, embed_w.shape[1])
    ids = torch.randint(0, embed_w.shape[0], (1, T))

    def embed(x):
        return embed_w[x]

    drafts = block_drafts(drafter, aux, ids, embed, lm_head, 3, chunk=4)
    fewer = block_drafts(drafter, aux, ids, embed, lm_head, 2, chunk=3)  # slots 1..2 only
    for t in range(T - 1):  # each row's block computed alone, anchored at t + 1
        h = drafter(aux, ids, torch.tensor([[t + 1]]), embed)
        alone = draft_logits(h, lm_head)[0, 0].argmax(-1)
        assert [int(d[0, t]) for d in drafts] == alone.tolist()
        assert [int(d[0, t]) for d in fewer] == alone.tolist()[:2]
    # drafts equal to the target's greedy path are all accepted, by the unroll's counting
    greedy = greedy_tokens(torch.randn(1, T, embed_w.shape[1]), lm_head)
    perfect = [torch.cat([greedy[:, k + 1 :], greedy[:, : k + 1]], 1) for k in range(3)]
    c = count_acceptance(perfect, greedy, torch.ones(1, T, dtype=torch.bool))
    assert c.correct.tolist() == c.scored.tolist()


def test_sglang_serves_the_export_as_dflash_with_its_block(trained, tmp_path):
    from eyrie.evaluate.online import dflash_settings, served_settings
    from eyrie.sglang.launch import online_command

    out = tmp_path / "sglang"
    export(trained, out, "sglang", dtype="float32")
    settings = served_settings(3, settings=dflash_settings(out))
    assert settings == [{"draft_tokens": 3, "topk": 1, "verify_tokens": 4, "algorithm": "DFLASH"}]
    cmd = online_command("t", 30000, draft_path=out, draft_tokens=3, algorithm="DFLASH")
    at = cmd.index("--speculative-algorithm")
    assert cmd[at : at + 6] == [
        "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(out),
        "--speculative-num-draft-tokens", "4",
    ]  # fmt: skip
    assert "--speculative-eagle-topk" not in cmd
    assert dflash_settings(tmp_path) is None  # no export there: EAGLE-3's settings stay
