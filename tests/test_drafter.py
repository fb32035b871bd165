"""The drafter against independent references: transformers' Llama blocks for step 0, and a
token-by-token simulation of serving (extend, then chain drafting with a growing KV cache,
complex-number RoPE, explicit softmax) for every unroll step."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from eyrie.target.tensors import read_target_tensors
from eyrie.train.model import (
    Drafter,
    DrafterConfig,
    DrafterError,
    TargetHead,
    shift_left,
)

H, HEADS, KV, HD, INTER, V, N = 32, 4, 2, 8, 48, 64, 24


def tiny_config(**kw) -> DrafterConfig:
    base = dict(
        hidden_size=H,
        intermediate_size=INTER,
        num_attention_heads=HEADS,
        num_key_value_heads=KV,
        head_dim=HD,
        num_aux=3,
        vocab_size=V,
        draft_vocab_size=N,
        rms_norm_eps=1e-6,
        rope_theta=500.0,
    )
    base.update(kw)
    return DrafterConfig(**base)


def tiny_model(seed=0, **kw) -> tuple[Drafter, torch.Tensor]:
    torch.manual_seed(seed)
    model = Drafter(tiny_config(**kw)).double()
    with torch.no_grad():  # non-trivial norms, so a swapped norm shows up
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.3)
    tokens = torch.sort(torch.randperm(V)[:N]).values
    model.set_vocab(
        tokens - torch.arange(N), torch.zeros(V, dtype=torch.bool).index_fill(0, tokens, True)
    )
    embed = torch.randn(V, H, dtype=torch.float64)
    return model, embed


def batch(B=2, T=11, seed=1):
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(B, T, 3, H, generator=g, dtype=torch.float64)
    ids = torch.randint(0, V, (B, T), generator=g)
    return aux, ids


# ---------------------------------------------------------------------------------------------
# step 0 against transformers' Llama blocks


def test_step0_matches_transformers_llama_blocks():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaAttention,
        LlamaMLP,
        LlamaRMSNorm,
        LlamaRotaryEmbedding,
    )

    model, embed = tiny_model()
    layer = model.midlayer
    aux, ids = batch()
    B, T = ids.shape
    # attention on the 2H concat: an HF layer whose hidden size is 2H (its o_proj maps back
    # to 2H; ours is its top half)
    cfg2 = LlamaConfig(
        hidden_size=2 * H,
        num_attention_heads=HEADS,
        num_key_value_heads=KV,
        head_dim=HD,
        intermediate_size=INTER,
        rms_norm_eps=1e-6,
        rope_theta=500.0,
        vocab_size=V,
    )
    cfg2._attn_implementation = "eager"
    cfg1 = LlamaConfig(
        hidden_size=H,
        intermediate_size=INTER,
        rms_norm_eps=1e-6,
        vocab_size=V,
        num_attention_heads=HEADS,
        num_key_value_heads=KV,
        head_dim=HD,
    )
    attn = LlamaAttention(cfg2, layer_idx=0).double()
    mlp = LlamaMLP(cfg1).double()
    norms = {n: LlamaRMSNorm(H, eps=1e-6).double() for n in ("in", "hid", "post", "final")}
    with torch.no_grad():
        for ours, theirs in (
            ("q_proj", attn.q_proj),
            ("k_proj", attn.k_proj),
            ("v_proj", attn.v_proj),
        ):
            theirs.weight.copy_(getattr(layer.self_attn, ours).weight)
        attn.o_proj.weight.zero_()
        attn.o_proj.weight[:H].copy_(layer.self_attn.o_proj.weight)
        for n in ("gate_proj", "up_proj", "down_proj"):
            getattr(mlp, n).weight.copy_(getattr(layer.mlp, n).weight)
        norms["in"].weight.copy_(layer.input_layernorm.weight)
        norms["hid"].weight.copy_(layer.hidden_norm.weight)
        norms["post"].weight.copy_(layer.post_attention_layernorm.weight)
        norms["final"].weight.copy_(model.norm.weight)
    rope = LlamaRotaryEmbedding(cfg2)
    pos = torch.arange(T)[None].expand(B, T)
    with torch.no_grad():
        h = model.fc(aux.flatten(-2))
        e = embed[shift_left(ids, 1)]  # row t is fed x_{t+1}
        x = torch.cat([norms["in"](e), norms["hid"](h)], dim=-1)
        cos, sin = rope(x, pos)
        causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        a = attn(x, (cos.double(), sin.double()), causal.expand(B, 1, T, T))[0][..., :H]
        h1 = h + a
        out = h1 + mlp(norms["post"](h1))
        want = model.lm_head(norms["final"](out))
        got = model(aux, ids, lambda t: embed[t], steps=1)[0]
    # transformers computes RoPE angles and RMS norms in fp32 even for fp64 inputs: ~1e-6 noise;
    # a misaligned token, position, norm or residual moves the logits by O(0.1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# every unroll step against a token-by-token serving simulation


def ref_rms(x, w, eps=1e-6):
    return w * (x / torch.sqrt((x * x).mean() + eps))


def ref_rope(x, pos, theta=500.0):
    """RoPE as a complex rotation of the pairs (x[i], x[i + hd/2]) by pos * theta^(-2i/hd)."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float64) / half)
    z = torch.complex(x[..., :half], x[..., half:]) * torch.exp(1j * pos * freqs)
    return torch.cat([z.real, z.imag], dim=-1)


def serve_chain(model, embed, aux, ids, n, steps):
    """Draft logits at the last extended row (n-1) for steps 0..steps-1, one token at a time.

    Extend: rows s = 0..n-1, hidden fc(aux_s), token x_{s+1}, position s. Then chain drafting
    from row n-1: step j feeds its own previous output and token x_{n+j} at position n-1+j,
    attending to every cache entry so far.
    """
    L = model.midlayer
    at = L.self_attn
    rep = HEADS // KV

    def kv_q(hidden, token, pos):
        x = torch.cat(
            [ref_rms(embed[token], L.input_layernorm.weight), ref_rms(hidden, L.hidden_norm.weight)]
        )
        q = at.q_proj(x).view(HEADS, HD)
        k = at.k_proj(x).view(KV, HD)
        v = at.v_proj(x).view(KV, HD)
        return ref_rope(q, pos), ref_rope(k, pos), v

    def attend(q, keys, values):
        out = []
        for head in range(HEADS):
            g = head // rep
            s = torch.stack([q[head] @ kk[g] for kk in keys]) / HD**0.5
            p = torch.exp(s - s.max())
            p = p / p.sum()
            out.append(sum(pi * vv[g] for pi, vv in zip(p, values, strict=True)))
        return at.o_proj(torch.cat(out))

    def finish(hidden, a):
        h1 = hidden + a
        return h1 + L.mlp(ref_rms(h1, L.post_attention_layernorm.weight))

    keys, values = [], []
    hidden = None
    for s in range(n):
        g = model.fc(aux[s].flatten())
        q, k, v = kv_q(g, ids[s + 1], s)
        keys.append(k)
        values.append(v)
        if s == n - 1:
            hidden, q_last = g, q
    out = finish(hidden, attend(q_last, keys, values))
    logits = [model.lm_head(ref_rms(out, model.norm.weight))]
    for j in range(1, steps):
        q, k, v = kv_q(out, ids[n + j], n - 1 + j)
        keys.append(k)
        values.append(v)
        out = finish(out, attend(q, keys, values))
        logits.append(model.lm_head(ref_rms(out, model.norm.weight)))
    return logits


@pytest.mark.parametrize("n", [1, 4, 7])
def test_unroll_equals_serving_chain(n):
    steps = 4
    model, embed = tiny_model(seed=n)
    aux, ids = batch(B=2, T=12, seed=n)
    with torch.no_grad():
        unrolled = model(aux, ids, lambda t: embed[t], steps)
        for b in range(2):
            chain = serve_chain(model, embed, aux[b], ids[b], n, steps)
            for k in range(steps):
                torch.testing.assert_close(unrolled[k][b, n - 1], chain[k], rtol=1e-9, atol=1e-9)


def test_padding_does_not_change_real_rows():
    model, embed = tiny_model()
    aux, ids = batch(B=1, T=9)
    pad_aux = torch.cat([aux, torch.randn(1, 5, 3, H, dtype=torch.float64)], dim=1)
    pad_ids = torch.cat([ids, torch.randint(0, V, (1, 5))], dim=1)
    with torch.no_grad():
        a = model(aux, ids, lambda t: embed[t], 3)
        b = model(pad_aux, pad_ids, lambda t: embed[t], 3)
    for k in range(3):  # row t at step k reads tokens up to t+k+1: rows t <= 9-k-2 are unpadded
        torch.testing.assert_close(a[k][:, : 9 - k - 1], b[k][:, : 9 - k - 1])


def test_state_dict_names_are_sglang_names():
    model, _ = tiny_model()
    names = set(model.state_dict())
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
    assert {n.split(".")[0] for n in names} == {"fc", "midlayer", "norm", "lm_head", "d2t", "t2d"}
    assert model.d2t.dtype == torch.int64 and model.t2d.dtype == torch.bool


# ---------------------------------------------------------------------------------------------
# config and the target's tensors


def test_config_from_llama_and_mla_targets():
    llama = {
        "hidden_size": 256,
        "intermediate_size": 704,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 4096,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"},
        "max_position_embeddings": 1024,
    }
    c = DrafterConfig.from_target(llama, num_aux=3, draft_vocab_size=1024)
    assert (c.head_dim, c.num_key_value_heads, c.rope_theta) == (32, 2, 5e5)
    # "heads": as many as the query heads, for any target (SmolLM2: 9 heads over 3)
    smol = {**llama, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64}
    full = DrafterConfig.from_target(smol, num_aux=3, draft_vocab_size=1024,
                                     overrides={"num_key_value_heads": "heads"})  # fmt: skip
    assert full.num_key_value_heads == 9
    with pytest.raises(DrafterError, match="number, null"):
        DrafterConfig.from_target(llama, num_aux=3, draft_vocab_size=1024,
                                  overrides={"num_key_value_heads": "all"})  # fmt: skip
    mla = {
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 64,
        "kv_lora_rank": 512,
        "vocab_size": 4096,
    }
    c = DrafterConfig.from_target(mla, num_aux=3, draft_vocab_size=100)
    assert c.head_dim == 64 and c.num_key_value_heads == 16 and c.rope_theta == 10000.0
    c = DrafterConfig.from_target(
        mla, num_aux=3, draft_vocab_size=100, overrides={"num_key_value_heads": 4, "head_dim": None}
    )
    assert c.num_key_value_heads == 4
    with pytest.raises(DrafterError, match="multiple"):
        DrafterConfig.from_target(
            mla, num_aux=3, draft_vocab_size=10, overrides={"num_key_value_heads": 5}
        )
    with pytest.raises(DrafterError, match="draft_vocab_size"):
        DrafterConfig.from_target(llama, num_aux=3, draft_vocab_size=5000)
    # a misspelt key (here YAML's "{intermediate_size:704}", one key with no value) is refused
    with pytest.raises(DrafterError, match=r"unknown keys \['intermediate_size:704'\]"):
        DrafterConfig.from_target(
            llama, num_aux=3, draft_vocab_size=10, overrides={"intermediate_size:704": None}
        )


def write_target(folder, tensors: dict, *, tied=False, shards=None, vocab=V, hidden=H):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps({"hidden_size": hidden, "vocab_size": vocab, "tie_word_embeddings": tied})
    )
    if shards is None:
        save_file(tensors, str(folder / "model.safetensors"))
        return
    weight_map = {}
    for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, str(folder / fname))
        weight_map.update({n: fname for n in names})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_read_target_tensors_forms(tmp_path):
    emb, head = torch.randn(V, H), torch.randn(V, H)
    other = torch.randn(3, 3)
    write_target(tmp_path / "plain", {"model.embed_tokens.weight": emb, "lm_head.weight": head})
    e, h, _ = read_target_tensors(tmp_path / "plain")
    assert torch.equal(e, emb) and torch.equal(h, head)

    write_target(
        tmp_path / "sharded",
        {"model.embed_tokens.weight": emb, "lm_head.weight": head, "x.weight": other},
        shards=[["model.embed_tokens.weight", "x.weight"], ["lm_head.weight"]],
    )
    e, h, _ = read_target_tensors(tmp_path / "sharded")
    assert torch.equal(e, emb) and torch.equal(h, head)

    write_target(tmp_path / "tied", {"model.embed_tokens.weight": emb}, tied=True)
    e, h, _ = read_target_tensors(tmp_path / "tied")
    assert torch.equal(h, emb)

    write_target(
        tmp_path / "vlm", {"model.language_model.embed_tokens.weight": emb, "lm_head.weight": head}
    )
    e, _, _ = read_target_tensors(tmp_path / "vlm")
    assert torch.equal(e, emb)

    # padded vocab rows (a common TP-friendly layout) are cut to vocab_size
    write_target(
        tmp_path / "padded",
        {
            "model.embed_tokens.weight": torch.randn(V + 8, H),
            "lm_head.weight": torch.randn(V + 8, H),
        },
    )
    e, h, _ = read_target_tensors(tmp_path / "padded")
    assert e.shape == h.shape == (V, H)

    write_target(tmp_path / "untied", {"model.embed_tokens.weight": emb})
    with pytest.raises(DrafterError, match="no lm_head"):
        read_target_tensors(tmp_path / "untied")
    write_target(
        tmp_path / "wrong", {"model.embed_tokens.weight": emb, "lm_head.weight": head}, hidden=H + 1
    )
    with pytest.raises(DrafterError, match="mixes two models"):
        read_target_tensors(tmp_path / "wrong")


def test_target_head_restricts_and_renormalizes():
    torch.manual_seed(0)
    head = torch.randn(V, H, dtype=torch.float64)
    tokens = torch.sort(torch.randperm(V)[:N]).values
    th = TargetHead(torch.randn(V, H, dtype=torch.float64), head, tokens)
    final = torch.randn(2, 5, H, dtype=torch.float64)
    probs, greedy = th.targets(final, chunk=3)
    full = torch.softmax(final @ head.T, dim=-1)
    restricted = full[..., tokens] / full[..., tokens].sum(-1, keepdim=True)
    torch.testing.assert_close(probs, restricted, rtol=1e-9, atol=1e-12)
    assert torch.equal(greedy, full.argmax(-1))


# ---------------------------------------------------------------------------------------------
# the fused unroll attention against the joint softmax written out


def joint_softmax_attention(q, cache):
    """Row t: softmax over [step-0 keys 0..t, its own keys of steps 1..k], explicit mask."""
    B, nh, T, hd = q.shape
    keys = torch.cat([k for k, _ in cache], 2)  # (B, nh, (k+1) T, hd)
    values = torch.cat([v for _, v in cache], 2)
    s = q @ keys.transpose(-1, -2) / hd**0.5
    t = torch.arange(T)
    j = torch.arange(len(cache) * T)
    step, col = j // T, j % T
    seen = ((step == 0) & (col <= t[:, None])) | ((step > 0) & (col == t[:, None]))
    return torch.softmax(s.masked_fill(~seen, float("-inf")), -1) @ values


def attention_inputs(steps, dtype=torch.float64, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    B, nh, T, hd = 2, 4, 9, 8

    def r():
        return (scale * torch.randn(B, nh, T, hd, generator=g, dtype=torch.float64)).to(dtype)

    return r(), [(r(), r()) for _ in range(steps)]


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_unroll_attention_and_its_gradients_match_the_joint_softmax(steps):
    from eyrie.train.model import unroll_attention

    q, cache = attention_inputs(steps)
    leaves = [q] + [x for kv in cache for x in kv]
    for x in leaves:
        x.requires_grad_(True)
    grad = torch.randn_like(q)
    fused = unroll_attention(q, cache)
    want = joint_softmax_attention(q, cache)
    torch.testing.assert_close(fused, want, rtol=1e-10, atol=1e-10)
    got_grads = torch.autograd.grad(fused, leaves, grad)
    want_grads = torch.autograd.grad(want, leaves, grad)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_unroll_attention_in_bf16_is_as_close_as_its_rounded_inputs_allow():
    """bf16 as on a GPU: against the exact joint softmax of the same bf16-rounded inputs, the
    error stays within a few bf16 steps of the output's size."""
    from eyrie.train.model import unroll_attention

    for seed in (3, 4):
        q, cache = attention_inputs(3, scale=1.5, seed=seed)
        cache16 = [(k.bfloat16(), v.bfloat16()) for k, v in cache]
        want = joint_softmax_attention(
            q.bfloat16().double(), [(k.double(), v.double()) for k, v in cache16]
        )
        got = unroll_attention(q.bfloat16(), cache16)
        assert got.dtype == torch.bfloat16
        err = (got.double() - want).abs().max().item()
        assert err < 4 * 2**-8 * want.abs().max().item(), err


def test_scored_only_logits_are_the_first_rows_of_the_full_ones():
    model, embed = tiny_model()
    aux, ids = batch(B=2, T=10)
    with torch.no_grad():
        full = model(aux, ids, lambda t: embed[t], 4)
        scored = model(aux, ids, lambda t: embed[t], 4, scored_only=True)
    for k in range(4):
        assert scored[k].shape[1] == 10 - k - 2
        torch.testing.assert_close(scored[k], full[k][:, : 10 - k - 2])
