"""The DFlash drafter in the transformers loop, as SGLang's DFlash worker runs it.

Each verified token's aux states become keys and values in every draft layer once, when the
target has seen the token (``extend``); a proposal is one pass over the block [last verified
token, M, ..., M] at the next positions, attending to all cached rows and to its own slots.
The interface is eyrie.evaluate.draft_runner.DraftRunner's chain part (reset, extend, propose,
length), so ``speculative_generate`` verifies its drafts like EAGLE-3's.
"""

from __future__ import annotations

import torch

from eyrie.evaluate.target_runner import SpeculateError
from eyrie.train.dflash import DFlashDrafter, draft_logits


class BlockRunner:
    def __init__(self, drafter: DFlashDrafter, embed, lm_head: torch.Tensor):
        self.d = drafter.eval()
        self.embed = embed
        self.lm_head = lm_head
        self.block_size = drafter.config.block_size
        self.reset()

    def reset(self) -> None:
        self.kv: list[tuple] | None = None  # per layer: keys, values (1, rows, heads, head_dim)
        self.last: int | None = None  # the last verified token: the next block's first slot

    @property
    def length(self) -> int:
        return 0 if self.kv is None else self.kv[0][0].shape[1]

    @torch.inference_mode()
    def extend(self, aux: torch.Tensor, next_tokens: list[int], start: int) -> None:
        """Cache rows start.. (the target's aux states there); the last of ``next_tokens``,
        each the token after its row, is the verified token the next block starts from."""
        if start != self.length:
            raise SpeculateError(f"drafter cache holds {self.length} rows, extend asked at {start}")
        dtype = self.d.fc.weight.dtype
        ctx = self.d.context(aux.to(dtype))
        pos = torch.arange(start, start + ctx.shape[1], device=ctx.device)[None]
        new = self.d.context_keys(ctx, pos)
        if self.kv is None:
            self.kv = new
        else:
            self.kv = [
                (torch.cat([k, nk], 1), torch.cat([v, nv], 1))
                for (k, v), (nk, nv) in zip(self.kv, new, strict=True)
            ]
        self.last = int(next_tokens[-1])

    @torch.inference_mode()
    def propose(self, n: int) -> list[int]:
        """The block's first ``n`` drafts (target token ids), n <= block_size - 1."""
        if not 1 <= n < self.block_size:
            raise SpeculateError(
                f"a DFlash block of {self.block_size} drafts 1..{self.block_size - 1} tokens, "
                f"not {n}; set evaluate.draft_tokens to block_size - 1"
            )
        device = self.kv[0][0].device
        first = torch.zeros(1, 1, dtype=torch.long, device=device)  # the block at row 0 of [last]
        ids, positions = self.d.blocks(torch.tensor([[self.last]], device=device), first)
        positions = positions + self.length
        visible = torch.ones(1, 1, self.length, dtype=torch.bool, device=device)
        h = self.embed(ids).to(self.d.fc.weight.dtype)
        out = self.d.run_blocks(h, positions, self.kv, visible)
        return draft_logits(out[..., : n + 1, :], self.lm_head)[0, 0].argmax(-1).tolist()
