"""DFlash: a drafter that proposes a whole block of tokens in one pass (arXiv 2602.06036).

The shape is the one SGLang 0.5.12 serves (`sglang/srt/models/dflash.py`, `DFlashDraftModel`):

    context   aux states of K target layers per verified token   (T, K, H)
              -> fc (K*H -> H) -> hidden_norm                     one vector per token
              -> in every layer: k_proj, k_norm, RoPE at the token's position; v_proj
    block     [x_a, M, M, ..., M]  (the last verified token, then B-1 mask tokens)
              -> the target's embedding, positions a .. a+B-1
    layer     pre-norm attention + SiLU MLP (Qwen3: per-head q_norm and k_norm)
              the block attends to every context token before a and to all of its own B slots
              (no causal order inside a block)
    output    norm -> the target's lm_head; slot k predicts the token at position a+k

Training takes many anchors a per sample in one pass (each block sees the context before its own
anchor only, and nothing of the other blocks). The embedding and lm_head are the target's and
stay frozen; they are not part of this module or of its export.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from eyrie.common.hf_config import text_config
from eyrie.train.model import (
    MLP,
    DrafterError,
    RMSNorm,
    apply_rope,
    config_from_dict,
    rope_cos_sin,
    target_layer_shape,
    wide,
    with_overrides,
)

# SGLang 0.5.12's DFlash reads rope_theta from an attribute transformers 5.x no longer sets on a
# Qwen3 config, and falls back to 1e6: train at the value it will serve with
SERVED_ROPE_THETA = 1_000_000.0


@dataclass
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int  # draft layers
    num_aux: int  # K, the target layers fused by fc
    vocab_size: int  # the target's: the drafter reads its embedding and lm_head
    block_size: int  # B: the verified token and B-1 drafts
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = SERVED_ROPE_THETA
    max_position_embeddings: int = 32768
    hidden_act: str = "silu"

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise DrafterError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}); fix train.drafter"
            )
        if self.block_size < 2:
            raise DrafterError(f"train.dflash.block_size is {self.block_size}; use 2 or more")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise DrafterError(
                f"train.dflash.mask_token_id {self.mask_token_id} is not a row of the target's "
                f"embedding (0..{self.vocab_size - 1}); pick an existing token id"
            )

    @classmethod
    def from_target(cls, target: dict, *, num_aux: int, dflash: dict, overrides: dict | None):
        """The drafter's shape from the target's config.json; ``overrides`` (train.drafter) win.
        RoPE runs at the theta SGLang serves, not the target's."""
        values = target_layer_shape(target)
        values.update(
            num_hidden_layers=int(dflash["layers"]),
            num_aux=int(num_aux),
            block_size=int(dflash["block_size"]),
            mask_token_id=mask_token(text_config(target), dflash.get("mask_token_id")),
            rope_theta=SERVED_ROPE_THETA,
        )
        return cls(**with_overrides(values, overrides, cls))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DFlashConfig:
        return config_from_dict(cls, d, "DFlash config")


def mask_token(text: dict, chosen: int | None) -> int:
    """train.dflash.mask_token_id, else the target's pad token, else its (first) eos token.

    The mask is an existing row of the target's embedding: only slots 1.. of a block hold it,
    so its meaning comes from where it stands, not from which token it is.
    """
    if chosen is not None:
        return int(chosen)
    for key in ("pad_token_id", "eos_token_id"):
        value = text.get(key)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0


class BlockAttention(nn.Module):
    """Attention of a block's slots over the context before its anchor and over the block."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.theta = cfg.rope_theta
        H = cfg.hidden_size
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)

    def keys(self, x: torch.Tensor, positions: torch.Tensor) -> tuple:
        """(k, v) of rows x (..., H) at ``positions`` (...): (..., nh, hd) each, heads repeated."""
        k = self.k_norm(self.k_proj(x).unflatten(-1, (self.nkv, self.hd)))
        v = self.v_proj(x).unflatten(-1, (self.nkv, self.hd))
        cos, sin = rope_cos_sin(positions.reshape(-1), self.hd, self.theta, k.dtype)
        k = apply_rope(k, cos.view(*positions.shape, 1, -1), sin.view(*positions.shape, 1, -1))
        rep = self.nh // self.nkv
        return k.repeat_interleave(rep, -2), v.repeat_interleave(rep, -2)

    def forward(self, x, positions, ctx_k, ctx_v, visible) -> torch.Tensor:
        """x (b, N, B, H) block rows at positions (b, N, B); ctx_k/ctx_v (b, T, nh, hd);
        visible (b, N, T): which context rows each block may read."""
        q = self.q_norm(self.q_proj(x).unflatten(-1, (self.nh, self.hd)))
        cos, sin = rope_cos_sin(positions.reshape(-1), self.hd, self.theta, q.dtype)
        q = apply_rope(q, cos.view(*positions.shape, 1, -1), sin.view(*positions.shape, 1, -1))
        bk, bv = self.keys(x, positions)
        scale = self.hd**-0.5
        s_ctx = torch.einsum("bnqhd,bthd->bnhqt", q, ctx_k) * scale
        s_ctx = s_ctx.masked_fill(~visible[:, :, None, None, :], float("-inf"))
        s_blk = torch.einsum("bnqhd,bnkhd->bnhqk", q, bk) * scale
        T = ctx_k.shape[1]
        p = torch.softmax(torch.cat([s_ctx, s_blk], -1).to(wide(q.dtype)), -1).to(q.dtype)
        out = torch.einsum("bnhqt,bthd->bnqhd", p[..., :T], ctx_v)
        out = out + torch.einsum("bnhqk,bnkhd->bnqhd", p[..., T:], bv)
        return self.o_proj(out.flatten(-2))


class BlockLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = BlockAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h, positions, ctx_kv, visible):
        h = h + self.self_attn(self.input_layernorm(h), positions, *ctx_kv, visible)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(cfg.num_aux * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(BlockLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)

    @torch.no_grad()
    def init_norm_from_target(self, norm: torch.Tensor | None) -> None:
        """The final norm starts at the target's, whose lm_head reads the drafter's output."""
        if norm is not None:
            self.norm.weight.copy_(norm.float())

    def context(self, aux: torch.Tensor) -> torch.Tensor:
        """(b, T, K, H) aux states -> (b, T, H): what every layer's context keys are made of."""
        return self.hidden_norm(self.fc(aux.flatten(-2)))

    def blocks(self, input_ids: torch.Tensor, anchors: torch.Tensor) -> tuple:
        """Token ids (b, N, B) of the blocks at ``anchors`` (b, N) and their positions."""
        B = self.config.block_size
        ids = torch.full((*anchors.shape, B), self.config.mask_token_id, device=anchors.device)
        ids[..., 0] = input_ids.gather(1, anchors.clamp(min=0))
        positions = anchors.clamp(min=0)[..., None] + torch.arange(B, device=anchors.device)
        return ids, positions

    def context_keys(self, ctx: torch.Tensor, positions: torch.Tensor) -> list[tuple]:
        """Each layer's (keys, values) of context rows (b, T, H) at ``positions`` (b, T): what
        a server caches per verified token. No input norm: the context is keys and values only.
        """
        return [layer.self_attn.keys(ctx, positions) for layer in self.layers]

    def run_blocks(self, h, positions, ctx_kv: list[tuple], visible) -> torch.Tensor:
        """Block inputs h (b, N, B, H) at ``positions`` through the layers, over the context
        keys ``visible`` (b, N, T) to each block: the normed outputs."""
        for layer, kv in zip(self.layers, ctx_kv, strict=True):
            h = layer(h, positions, kv, visible)
        return self.norm(h)

    def context_kv(self, aux: torch.Tensor) -> list[tuple]:
        """Each layer's context (keys, values) of aux states (b, T, K, H), rows at 0..T-1."""
        ctx = self.context(aux)
        T = ctx.shape[1]
        return self.context_keys(ctx, torch.arange(T, device=ctx.device).expand(len(ctx), T))

    def forward(self, aux, input_ids, anchors, embed, ctx_kv=None) -> torch.Tensor:
        """Normed outputs (b, N, B, H) of the blocks at ``anchors`` (b, N; -1: none).

        Block n reads the context rows before its anchor, ``embed`` maps ids to the target's
        input embeddings; the target's lm_head turns slot k into the token at anchor + k.
        ``ctx_kv``: context_kv(aux) already computed, when several anchor sets share a batch."""
        if ctx_kv is None:
            ctx_kv = self.context_kv(aux)
        T = aux.shape[1]
        ids, positions = self.blocks(input_ids, anchors)
        visible = torch.arange(T, device=aux.device) < anchors[..., None]
        return self.run_blocks(embed(ids).to(ctx_kv[0][0].dtype), positions, ctx_kv, visible)


def draft_logits(hidden: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
    """Slots 1..B-1 of block outputs (..., B, H) through the target's lm_head: (..., B-1, V).

    One matmul over every block's slots: on the strided slice itself, F.linear runs a batched
    matmul of B-1 rows per block, which is slower (benchmarks/bench_dflash_heldout.py)."""
    x = hidden[..., 1:, :]
    logits = F.linear(x.reshape(-1, x.shape[-1]), lm_head.to(hidden.dtype))
    return logits.view(*x.shape[:-1], -1)
