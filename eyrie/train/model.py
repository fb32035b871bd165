"""The EAGLE-3 drafter: one Llama decoder layer on the target's fused aux hidden states.

What it computes, per position t (H = hidden size, k = number of aux layers):

    g_t   = fc(concat(aux_t[0], ..., aux_t[k-1]))             k*H -> H, no bias
    x_t   = concat(input_layernorm(embed(token)), hidden_norm(h))   2H: q/k/v take 2H inputs
    h'    = h + o_proj(attention(x))                         residual starts at h, not at embed
    out   = h' + mlp(post_attention_layernorm(h'))           passed to the next draft step
    logit = lm_head(norm(out))                               over the draft vocabulary

The embedding (and, for the loss, the lm_head) are the target's, frozen: see `TargetHead`.
Parameter names follow SGLang's LlamaForCausalLMEagle3 checkpoints (``midlayer.*``, ``fc``,
``norm``, ``lm_head``, ``d2t``, ``t2d``) so the state dict is the export, unrenamed.

Training-time test (the unroll) and its alignment. Tokens x_0..x_{T-1}; the target at position
j produced aux_j, final_j, and p_j = softmax(lm_head(final_j)), its distribution of x_{j+1}.
Row t of draft step k feeds token x_{t+k+1} at position t+k and is scored against p_{t+k+1},
i.e. it predicts x_{t+k+2}:

    row t                 t=0        t=1        t=2        ...
    step 0  hidden        g_0        g_1        g_2            (fused target aux states)
            token         x_1        x_2        x_3
            position      0          1          2
            target        p_1->x_2   p_2->x_3   p_3->x_4
    step 1  hidden        out0_0     out0_1     out0_2         (its own step-0 output)
            token         x_2        x_3        x_4
            position      1          2          3
            target        p_2->x_3   p_3->x_4   p_4->x_5
    step k  hidden        out(k-1)_t,  token x_{t+k+1},  position t+k,  target p_{t+k+1}

Attention at step k, row t sees: the step-0 keys of rows 0..t (causal: the context the target
verified) and the keys of row t itself at steps 1..k (its own earlier drafts), never another
row's draft keys. That is what serving does: after the target verifies x_0..x_n, the drafter
"extends" rows 0..n-1 (hidden of t paired with token t+1, at position t), then drafts step by
step from the last row, one position further each step, attending to the extended cache and
its own chain. Row t is scored only when x_{t+k+2} exists and is a loss-mask token; since the
tokens fed are the data's own (a draft after a wrong token is rejected anyway), every score
is the chance the k-th draft token is right given the earlier ones were.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from eyrie.common.errors import DrafterError
from eyrie.common.hf_config import text_config
from eyrie.target.tensors import read_target_tensors
from eyrie.train.loss import scored_rows

# ---------------------------------------------------------------------------------------------
# config


@dataclass
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_aux: int  # k, the number of aux layers fused by fc
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    hidden_act: str = "silu"

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise DrafterError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}); fix train.drafter"
            )
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise DrafterError(
                f"draft_vocab_size {self.draft_vocab_size} must be in 1..{self.vocab_size} "
                "(the target's vocabulary); fix draft_vocab.size"
            )
        if self.hidden_act != "silu":
            raise DrafterError(f"hidden_act {self.hidden_act!r}: only 'silu' is supported")

    @classmethod
    def from_target(
        cls, target: dict, *, num_aux: int, draft_vocab_size: int, overrides: dict | None = None
    ) -> DrafterConfig:
        """The drafter's shape from the target's config.json (dict); ``overrides`` wins."""
        values = target_layer_shape(target)
        values.update(num_aux=int(num_aux), draft_vocab_size=int(draft_vocab_size))
        return cls(**with_overrides(values, overrides, cls))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DrafterConfig:
        return config_from_dict(cls, d, "drafter config")


def target_layer_shape(target: dict) -> dict:
    """A drafter layer's shape from the target's config.json (dict), and its vocabulary.

    Hidden size must equal the target's (the embedding is shared). Attention dims are the
    target's when it uses plain multi-head attention; for latent attention (MLA) targets,
    whose head_dim means something else, heads of hidden/num_heads are used.
    """
    t = text_config(target)
    hidden = int(t["hidden_size"])
    heads = int(t["num_attention_heads"])
    mla = "kv_lora_rank" in t
    head_dim = hidden // heads if mla else int(t.get("head_dim") or hidden // heads)
    kv = heads if mla else int(t.get("num_key_value_heads") or heads)
    rope = t.get("rope_parameters") or t.get("rope_scaling") or {}
    return dict(
        hidden_size=hidden,
        intermediate_size=int(t["intermediate_size"]),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        vocab_size=int(t["vocab_size"]),
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-5)),
        rope_theta=float(rope.get("rope_theta") or t.get("rope_theta") or 10000.0),
        max_position_embeddings=int(t.get("max_position_embeddings", 4096)),
    )


def with_overrides(values: dict, overrides: dict | None, cls) -> dict:
    """``values`` with train.drafter's non-null keys over them (any field of the config class
    ``cls``); num_key_value_heads "heads" means one key/value head per query head."""
    unknown = sorted(set(overrides or {}) - {f.name for f in fields(cls)})
    if unknown:
        raise DrafterError(
            f"train.drafter has unknown keys {unknown}; expected some of "
            "intermediate_size, num_attention_heads, num_key_value_heads, head_dim"
        )
    values = {**values, **{k: v for k, v in (overrides or {}).items() if v is not None}}
    if values["num_key_value_heads"] == "heads":
        values["num_key_value_heads"] = values["num_attention_heads"]
    elif isinstance(values["num_key_value_heads"], str):
        raise DrafterError(
            f"train.drafter.num_key_value_heads is {values['num_key_value_heads']!r}; use a "
            "number, null (the target's) or heads (as many as the drafter's query heads)"
        )
    return values


def config_from_dict(cls, d: dict, what: str):
    """A saved config dataclass back from its dict; a key it does not have is refused."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise DrafterError(f"{what} has unknown keys {unknown}; expected {sorted(names)}")
    return cls(**d)


# ---------------------------------------------------------------------------------------------
# building blocks


def wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype reductions run in: at least fp32 (bf16 activations), fp64 stays fp64."""
    return torch.promote_types(dtype, torch.float32)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(wide(dtype))
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype) -> tuple:
    """cos and sin of rotary angles, (T, head_dim), in the rotate-half (NeoX) layout."""
    exps = torch.arange(0, head_dim, 2, device=positions.device, dtype=wide(dtype)) / head_dim
    angles = positions.to(wide(dtype))[:, None] * (1.0 / theta**exps)[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Grouped-query attention whose q/k/v read the 2H concat, with the unroll's cache.

    ``cache`` is a list of (k, v) per draft step so far; step 0's keys are attended causally,
    later steps' keys only on the same row (see the module docstring).
    """

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.theta = cfg.rope_theta
        self.q_proj = nn.Linear(2 * cfg.hidden_size, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(2 * cfg.hidden_size, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(2 * cfg.hidden_size, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: list) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, self.hd, self.theta, q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.nh // self.nkv  # query head h reads kv head h // rep
        cache.append((k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)))
        out = unroll_attention(q, cache)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


def unroll_attention(q: torch.Tensor, cache: list) -> torch.Tensor:
    """Row t attends to step 0's keys 0..t and to its own keys of steps 1..k; (B, nh, T, hd).

    One fused causal attention (scaled_dot_product_attention: no T x T scores kept for the
    backward pass) does it all. Row t's own keys are folded into a single extra key, first in
    the sequence, that every row sees: its score is row t's log-sum-exp b_t over its own
    scores, carried by two extra query dims (the value high and low in q's dtype, so a bf16 q
    keeps b to fp32 precision) against a key of ones there, and its value is a one in an
    extra value dim. The fused softmax then gives w_t, the share of row t's own keys in the
    joint softmax, in that dim; their values enter as w_t times their softmax-weighted mean.
    A zero query row in front keeps the mask square and causal: row t+1 sees keys 0..t+1.
    """
    k0, v0 = cache[0]
    scale = 1.0 / math.sqrt(q.shape[-1])
    if len(cache) == 1:
        return F.scaled_dot_product_attention(q, k0, v0, is_causal=True, scale=scale)
    acc = wide(q.dtype)
    qa = q.to(acc)
    own = torch.stack([(qa * kj.to(acc)).sum(-1) * scale for kj, _ in cache[1:]])  # (k, B, nh, T)
    lse = torch.logsumexp(own, 0)  # b_t
    mean = sum(
        w[..., None] * vj.to(acc)
        for w, (_, vj) in zip(torch.softmax(own, 0), cache[1:], strict=True)
    )
    b = lse / scale
    b_hi = b.to(q.dtype)
    b_lo = (b - b_hi.to(acc)).to(q.dtype)
    pad = 8  # extra dims: kernels want head dims in multiples of 8
    q2 = F.pad(torch.stack([b_hi, b_lo], -1), (0, pad - 2))
    query = F.pad(torch.cat([q, q2], -1), (0, 0, 1, 0))  # a zero row in front
    extra = q.new_zeros(q.shape[0], q.shape[1], 1, q.shape[-1] + pad)
    key = torch.cat([extra.index_fill(-1, _cols(q, 2), 1.0), F.pad(k0, (0, pad))], 2)
    value = torch.cat([extra.index_fill(-1, _cols(q, 1), 1.0), F.pad(v0, (0, pad))], 2)
    joint = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale)
    hd = q.shape[-1]
    share = joint[:, :, 1:, hd].to(acc)
    return (joint[:, :, 1:, :hd].to(acc) + share[..., None] * mean).to(q.dtype)


def _cols(q: torch.Tensor, n: int) -> torch.Tensor:
    """The first n extra dims' indices, after q's own head dims."""
    return torch.arange(q.shape[-1], q.shape[-1] + n, device=q.device)


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """EAGLE-3's midlayer: attention on [embed ; hidden], the residual stream is the hidden."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, hidden, embeds, positions, cache):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        hidden = hidden + self.self_attn(x, positions, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


# ---------------------------------------------------------------------------------------------
# the drafter


class Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(cfg.num_aux * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = DecoderLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        # draft id i <-> target id i + d2t[i]; t2d marks the target ids in the draft vocab
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    @torch.no_grad()
    def init_head_from_target(self, lm_head: torch.Tensor, norm: torch.Tensor | None) -> None:
        """Start lm_head at the target's rows of the draft tokens, and norm at its final norm.

        Then the drafter's output space is the target's from the first step: an ``out`` equal
        to the target's last pre-norm state gives the target's logits. The target's final norm
        scale matters (toy-llama's is 1.75, not 1): with norm left at ones the first logits are
        a cooled copy of the target's, and the norm weight, at the learning rate, takes
        hundreds of steps to catch up.
        """
        self.lm_head.weight.copy_(lm_head[self.d2t + torch.arange(len(self.d2t))].float())
        if norm is not None:
            self.norm.weight.copy_(norm.float())

    @torch.no_grad()
    def init_attention_to_self(self, std: float = 0.04) -> None:
        """Start every query head equal to its key head, so attention starts peaked on self.

        The token embedding reaches the drafter only through attention (q/k/v read it; the
        residual stream starts at the fused hidden). With random q and k, row t's own token is
        one of t equally weighted values at first, and learning to pick it out takes many
        steps. With q = k at init, the score of a row with itself is |k|^2/sqrt(d), larger
        than with any less similar row; training moves q and k apart from there.
        """
        a = self.midlayer.self_attn
        nn.init.normal_(a.k_proj.weight, mean=0.0, std=std)
        k = a.k_proj.weight.view(a.nkv, a.hd, -1)
        a.q_proj.weight.copy_(k.repeat_interleave(a.nh // a.nkv, 0).reshape(a.nh * a.hd, -1))

    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """(B, T, k, H) aux states -> (B, T, H), the step-0 hidden."""
        return self.fc(aux.flatten(-2))

    def step(self, hidden, embeds, positions, cache) -> torch.Tensor:
        """One draft step for every row: the pre-norm output that feeds the next step."""
        return self.midlayer(hidden, embeds, positions, cache)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))

    def forward(self, aux, input_ids, embed, steps: int, scored_only=False) -> list[torch.Tensor]:
        """Draft logits of each unroll step, (B, T, draft_vocab) each; see the module docstring.

        ``embed`` maps token ids to the target's (frozen) input embeddings. ``scored_only``
        keeps step k's first ``scored_rows(k, T)`` rows, the ones the loss reads: the head
        then never makes the rows past them, nor their zero gradients in backward.
        """
        B, T = input_ids.shape
        positions = torch.arange(T, device=input_ids.device)
        hidden = self.fuse(aux)
        cache: list = []
        out = []
        for k in range(steps):
            tokens = shift_left(input_ids, k + 1)  # row t gets x_{t+k+1}
            hidden = self.step(hidden, embed(tokens), positions + k, cache)
            out.append(self.logits(hidden[:, : scored_rows(k, T)] if scored_only else hidden))
        return out


def shift_left(x: torch.Tensor, by: int, fill=0) -> torch.Tensor:
    """x[:, t + by] at row t, ``fill`` past the end (along dim 1)."""
    out = torch.full_like(x, fill)
    n = x.shape[1] - by
    if n > 0:
        out[:, :n] = x[:, by:]
    return out


# ---------------------------------------------------------------------------------------------
# the target's embedding and lm_head, frozen


class TargetHead:
    """The target's frozen embedding and lm_head: draft inputs and the training targets."""

    def __init__(self, embed: torch.Tensor, lm_head: torch.Tensor, draft_tokens: torch.Tensor):
        self.embed_weight = embed
        self.lm_head = lm_head
        self.draft_tokens = draft_tokens.long()

    @classmethod
    def from_pretrained(cls, folder, draft_tokens, device="cpu", dtype=torch.float32):
        embed, head, _ = read_target_tensors(folder)
        return cls(embed.to(device, dtype), head.to(device, dtype), draft_tokens.to(device))

    @property
    def vocab_size(self) -> int:
        return self.lm_head.shape[0]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_weight)

    @torch.no_grad()
    def targets(self, final: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
        """(p over the draft vocab (..., N), fp32 or wider; greedy target id over the full vocab).

        p is the target's distribution restricted to the draft vocabulary and renormalized:
        softmax of the target logits at the draft tokens.
        """
        shape = final.shape[:-1]
        flat = final.reshape(-1, final.shape[-1]).to(self.lm_head.dtype)
        head_draft = self.lm_head[self.draft_tokens]
        probs, greedy = [], []
        for s in range(0, flat.shape[0], chunk):
            x = flat[s : s + chunk]
            probs.append(torch.softmax((x @ head_draft.T).to(wide(x.dtype)), dim=-1))
            greedy.append((x @ self.lm_head.T).argmax(-1))
        n = len(self.draft_tokens)
        if not probs:
            return final.new_zeros(*shape, n, dtype=torch.float32), final.new_zeros(
                shape, dtype=torch.long
            )
        return torch.cat(probs).view(*shape, n), torch.cat(greedy).view(shape)
