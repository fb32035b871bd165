"""The draft vocabulary: the N target tokens the drafter can propose, and the maps both ways.

The N most frequent target tokens among the tokens the drafter learns to predict (loss-mask
positions of the train stores), ties broken by the lower token id, sorted by target id. Then

    d2t[i] = draft_tokens[i] - i      int64 (N,): target id of draft id i is i + d2t[i]
    t2d[v] = v is a draft token       bool (V,):  sum(t2d) == N

the layout SGLang and vLLM read (they add ``arange(N)`` to d2t; t2d they skip). Sorting by
target id makes d2t non-decreasing and non-negative.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from eyrie.common.atomic import atomic_path, write_json
from eyrie.common.errors import EyrieError

READ_TOKENS = 1 << 20  # tokens read per slice when counting


class VocabError(EyrieError, ValueError):
    """A draft vocabulary that is inconsistent or cannot be built; the message says why."""


@dataclass
class DraftVocab:
    draft_tokens: torch.Tensor  # int64 (N,), ascending target ids
    counts: torch.Tensor  # int64 (V,), loss-mask occurrences of each target token

    @property
    def size(self) -> int:
        return int(self.draft_tokens.numel())

    @property
    def vocab_size(self) -> int:
        return int(self.counts.numel())

    @property
    def d2t(self) -> torch.Tensor:
        return self.draft_tokens - torch.arange(self.size, dtype=torch.int64)

    @property
    def t2d(self) -> torch.Tensor:
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[self.draft_tokens] = True
        return mask

    def coverage(self) -> float:
        """Fraction of counted tokens that are in the draft vocabulary."""
        total = int(self.counts.sum())
        return float(self.counts[self.draft_tokens].sum()) / total if total else 0.0


def count_tokens(store_paths, vocab_size: int) -> torch.Tensor:
    """How often each target token sits at a loss-mask position, over the given stores."""
    import zarr

    from eyrie.store.shard import ShardReader

    counts = np.zeros(vocab_size, dtype=np.int64)
    for path in store_paths:
        reader = ShardReader(path)  # validates the store and its commit record
        group = zarr.open_group(str(path), mode="r")
        ids_arr, mask_arr = group["input_ids"], group["loss_mask"]
        for s in range(0, reader.num_tokens, READ_TOKENS):
            e = min(s + READ_TOKENS, reader.num_tokens)
            ids = np.asarray(ids_arr[s:e], dtype=np.int64)
            mask = np.asarray(mask_arr[s:e]).astype(bool)
            if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
                raise VocabError(
                    f"{path} holds token id {int(ids.max())}, outside the target's vocabulary "
                    f"of {vocab_size}: the store was extracted with another tokenizer; "
                    "re-extract it with the configured target"
                )
            counts += np.bincount(ids[mask], minlength=vocab_size)
    return torch.from_numpy(counts)


def build(counts: torch.Tensor, size: int) -> DraftVocab:
    """The top-``size`` tokens by count (ties: lower id first), sorted by target id.

    Tokens never seen fill the rest, lowest id first, so the size is always ``size``.
    """
    counts = torch.as_tensor(counts, dtype=torch.int64)
    vocab = counts.numel()
    if not 0 < size <= vocab:
        raise VocabError(
            f"draft_vocab.size {size} must be in 1..{vocab} (the target's vocabulary size)"
        )
    ids = torch.arange(vocab, dtype=torch.int64)
    # sort by count descending, then id ascending: a stable sort on -count over ascending ids
    order = ids[torch.argsort(-counts, stable=True)]
    top = torch.sort(order[:size]).values
    return DraftVocab(top, counts.clone())


def check_maps(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int | None = None) -> list[str]:
    """Problems with a (d2t, t2d) pair; empty when they are a consistent draft vocabulary."""
    problems = []
    if d2t.dtype != torch.int64 or d2t.ndim != 1:
        problems.append(f"d2t must be a 1-D int64 tensor, got {d2t.dtype} {tuple(d2t.shape)}")
        return problems
    if t2d.dtype != torch.bool or t2d.ndim != 1:
        problems.append(f"t2d must be a 1-D bool tensor, got {t2d.dtype} {tuple(t2d.shape)}")
        return problems
    n, v = d2t.numel(), t2d.numel()
    if vocab_size is not None and v != vocab_size:
        problems.append(f"t2d has {v} entries but the target vocabulary has {vocab_size}")
    if int(t2d.sum()) != n:
        problems.append(f"t2d marks {int(t2d.sum())} tokens but d2t has {n} (draft_vocab_size)")
    target = d2t + torch.arange(n, dtype=torch.int64)
    if n and (target.min() < 0 or target.max() >= v):
        problems.append(
            f"d2t + arange maps into [{int(target.min())}, {int(target.max())}], outside the "
            f"target vocabulary 0..{v - 1}"
        )
        return problems
    if target.unique().numel() != n:
        problems.append("d2t maps two draft ids to the same target token")
    elif not torch.equal(torch.nonzero(t2d).flatten(), torch.sort(target).values):
        problems.append("t2d does not mark exactly the target tokens that d2t maps to")
    return problems


def save(vocab: DraftVocab, path: str | Path, meta: dict) -> dict:
    """Write the maps (safetensors) and a JSON summary beside them, each atomically."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    summary = {
        "draft_vocab_size": vocab.size,
        "target_vocab_size": vocab.vocab_size,
        "tokens_counted": int(vocab.counts.sum()),
        "distinct_tokens_seen": int((vocab.counts > 0).sum()),
        "coverage": round(vocab.coverage(), 6),
        **meta,
    }
    tensors = {
        "draft_tokens": vocab.draft_tokens,
        "d2t": vocab.d2t,
        "t2d": vocab.t2d,
        "counts": vocab.counts,
    }
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"eyrie": json.dumps(summary)})
    write_json(path.with_suffix(".json"), summary)
    return summary


def load(path: str | Path) -> DraftVocab:
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise VocabError(f"draft vocabulary {path} does not exist; run `eyrie draft-vocab` first")
    t = load_file(str(path))
    try:
        vocab = DraftVocab(t["draft_tokens"], t["counts"])
        problems = check_maps(t["d2t"], t["t2d"], vocab.vocab_size)
    except KeyError as exc:
        raise VocabError(
            f"{path} lacks tensor {exc}; rebuild it with `eyrie draft-vocab`"
        ) from None
    if problems or not torch.equal(t["d2t"], vocab.d2t):
        raise VocabError(f"{path} is inconsistent ({'; '.join(problems) or 'd2t'}); rebuild it")
    return vocab
