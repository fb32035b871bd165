"""The trained EAGLE-3 drafter in the decoding loops, one position at a time.

The drafter follows the alignment of its training unroll (eyrie/train/model.py): row t pairs the
target's fused aux states at position t with token t+1 and sits at position t. After each
verify pass the rows of the accepted positions are appended to the drafter's own KV cache
("extend"); drafting then continues from the last row, one position further per draft, each
draft attending to the verified rows and to the drafts before it. The drafts' cache entries
are dropped again before the next extend, which recomputes those rows from the target's states.
"""

from __future__ import annotations

import torch

from eyrie.evaluate.target_runner import SpeculateError
from eyrie.train.model import apply_rope, rope_cos_sin


class DraftRunner:
    """The trained drafter with a KV cache of verified rows, proposing chains of drafts.

    Uses the drafter's own modules; the attention is the training unroll's restricted to one
    chain: causal over the verified rows, then each draft over the drafts before it. Batch-1
    drafting is a string of tiny operations, so the per-draft work is kept to the minimum: keys
    and values live in buffers that grow by doubling (a crop only moves the length), only the
    key/value heads are stored (SDPA reads them grouped), and rotary angles come from a table.
    """

    def __init__(self, drafter, embed):
        self.d = drafter.eval()
        self.embed = embed
        self.cfg = drafter.config
        self._to_target: list[int] | None = None
        self.reset()

    def reset(self) -> None:
        self.k = self.v = None  # (1, kv heads, capacity, head_dim); rows [0, length) are valid
        self._len = 0
        self._cos = self._sin = None  # rotary table, (capacity, head_dim)
        self.last = None  # (1, 1, H): the last verified row's output, where drafting starts

    @property
    def length(self) -> int:
        return self._len

    def crop(self, keep: int) -> None:
        self._len = min(self._len, keep)

    def cached(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The valid keys and values, (1, kv heads, length, head_dim) each."""
        return self.k[:, :, : self._len], self.v[:, :, : self._len]

    def _reserve(self, rows: int, like: torch.Tensor) -> None:
        """Room for ``rows`` cached positions (buffers and rotary table), doubling as needed."""
        attn = self.d.midlayer.self_attn
        have = 0 if self.k is None else self.k.shape[2]
        if rows <= have:
            return
        cap = max(rows, 2 * have, 256)
        shape = (1, attn.nkv, cap, attn.hd)
        k, v = like.new_zeros(shape), like.new_zeros(shape)
        if self.k is not None:
            old_k, old_v = self.cached()
            k[:, :, : self._len], v[:, :, : self._len] = old_k, old_v
        self.k, self.v = k, v
        positions = torch.arange(cap, device=like.device)
        self._cos, self._sin = rope_cos_sin(positions, attn.hd, attn.theta, like.dtype)

    def _layer(
        self,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        start: int,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The midlayer on rows at positions start.. (or ``positions``), appended to the cache;
        (1, T, H). ``mask`` (T, cached + T), True where a row attends, replaces the causal one."""
        layer, attn = self.d.midlayer, self.d.midlayer.self_attn
        T = tokens.shape[-1]
        x = torch.cat([layer.input_layernorm(self.embed(tokens)), layer.hidden_norm(hidden)], -1)
        q = attn.q_proj(x).view(1, T, attn.nh, attn.hd).transpose(1, 2)
        k = attn.k_proj(x).view(1, T, attn.nkv, attn.hd).transpose(1, 2)
        v = attn.v_proj(x).view(1, T, attn.nkv, attn.hd).transpose(1, 2)
        past = self._len
        self._reserve(past + T, q)  # positions never run past the rows cached
        at = slice(start, start + T) if positions is None else positions
        cos, sin = self._cos[at], self._sin[at]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        self.k[:, :, past : past + T], self.v[:, :, past : past + T] = k, v
        self._len = past + T
        if mask is None and T > 1:  # rows past.. attend causally: row i sees columns <= past + i
            rows = torch.arange(T, device=x.device)[:, None] + past
            mask = torch.arange(past + T, device=x.device)[None, :] <= rows
        out = torch.nn.functional.scaled_dot_product_attention(
            q,
            self.k[:, :, : self._len],
            self.v[:, :, : self._len],
            attn_mask=mask,
            enable_gqa=attn.nh != attn.nkv,
        )
        hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(1, T, attn.nh * attn.hd))
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    def target_ids(self) -> list[int]:
        """The target token id of each draft-vocabulary id, as a list (read once)."""
        if self._to_target is None:
            n = self.d.d2t.numel()
            self._to_target = self.d.draft_to_target(torch.arange(n, device=self.d.d2t.device))
            self._to_target = self._to_target.tolist()
        return self._to_target

    def rows(self, hidden, tokens, positions, mask) -> torch.Tensor:
        """Rows at arbitrary ``positions`` under an explicit ``mask`` (tree drafting)."""
        return self._layer(hidden, tokens, self._len, positions, mask)

    @torch.inference_mode()
    def extend(self, aux: torch.Tensor, next_tokens: list[int], start: int) -> None:
        """Add rows start.. : the target's aux states there, each with the token after it."""
        if start != self.length:
            raise SpeculateError(f"drafter cache holds {self.length} rows, extend asked at {start}")
        tokens = torch.tensor([next_tokens], dtype=torch.long, device=aux.device)
        hidden = self.d.fuse(aux.to(self.d.fc.weight.dtype))
        self.last = self._layer(hidden, tokens, start)[:, -1:]

    @torch.inference_mode()
    def chain_logits(self, tokens: list[int]) -> list[torch.Tensor]:
        """Draft-vocabulary logits of the drafts from the last row, feeding ``tokens`` as the
        drafts (len(tokens) + 1 logits); the drafts' cache entries are dropped afterwards."""
        verified = self.length
        hidden, out = self.last, [self.d.logits(self.last)[0, -1]]
        for j, tok in enumerate(tokens):
            t = torch.tensor([[tok]], dtype=torch.long, device=hidden.device)
            hidden = self._layer(hidden, t, verified + j)
            out.append(self.d.logits(hidden)[0, -1])
        self.crop(verified)
        return out

    @torch.inference_mode()
    def propose(self, n: int) -> list[int]:
        """n greedy drafts (target token ids) continuing the verified tokens."""
        verified = self.length
        hidden, drafts = self.last, []
        for j in range(n):
            draft = int(self.d.draft_to_target(self.d.logits(hidden)[0, -1].argmax()))
            drafts.append(draft)
            if j + 1 < n:
                t = torch.tensor([[draft]], dtype=torch.long, device=hidden.device)
                hidden = self._layer(hidden, t, verified + j)
        self.crop(verified)
        return drafts
