"""Baselines for the drafter's step-0 accuracy, on exactly the positions acc_0 is scored on.

A drafter's acceptance means little alone: a table of "after token x, the target usually says
y" already gets a good share of it on chat data. So every run measures, beside the drafter:

- bigram: x_{t+1} -> the target's most frequent greedy token at t+1 after it (fit on the train
  stores; a token never seen falls back to the most frequent label).
- probe: a 2-layer MLP per position on [aux_t, embed(x_{t+1})], exactly the drafter's step-0
  inputs but without attention over the context; ``with_final`` adds final_t too.
- context lookup: no training; the token that followed the most recent earlier occurrence of
  the last LOOKUP_MAX_N (down to 1) tokens, in the sample itself (prompt lookup decoding,
  SGLang's NGRAM drafts). A target that repeats itself hands this one most of its tokens; a
  drafter below it has not learned to copy from its context.

Rows and targets are the drafter's (eyrie/train/model.py): row t feeds token x_{t+1} with the
target's states at t and is right when it names greedy[t+1] = argmax(lm_head(final_{t+1})),
over the full vocabulary; it is scored when token t+2 exists, is within ``max_len`` and is a
loss-mask token. A drafter that cannot beat the probe is not using its context (or is broken).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from eyrie.common.errors import EyrieError
from eyrie.common.progress import bar

LOOKUP_MAX_N = 4  # longest suffix looked up; prompt lookup decoding's usual 3-4


class BaselineError(EyrieError, ValueError):
    """Stores that give the baselines nothing to score; the message names them and the fix."""


@dataclass
class Rows:
    """The scored step-0 rows of some stores: inputs (bf16, to keep memory low) and labels."""

    aux: torch.Tensor  # (n, k*H) aux_t, flattened
    final: torch.Tensor  # (n, H) final_t
    token: torch.Tensor  # (n,) x_{t+1}
    label: torch.Tensor  # (n,) greedy[t+1], a target id
    lookup: torch.Tensor | None = None  # (n,) the context lookup's guess at greedy[t+1]; -1: none

    def __len__(self) -> int:
        return len(self.label)


def context_lookup(ids: list[int], max_n: int = LOOKUP_MAX_N) -> list[int]:
    """guess[i]: the token after ids[: i + 1] by lookup, -1 when nothing matches. The longest
    suffix (max_n tokens down to 1) that occurred before, ending earlier, names the token that
    followed its most recent occurrence. One pass, a dict of n-grams: O(len(ids) * max_n)."""
    after: dict[tuple, int] = {}  # n-gram -> index of the token that followed it last
    guess = []
    for i in range(len(ids)):
        found = -1
        for n in range(min(max_n, i + 1), 0, -1):
            j = after.get(tuple(ids[i + 1 - n : i + 1]))
            if j is not None:
                found = ids[j]
                break
        guess.append(found)
        for n in range(1, min(max_n, i + 1) + 1):  # seen from the next position on
            after[tuple(ids[i + 1 - n : i + 1])] = i + 1
    return guess


@torch.no_grad()
def read_rows(store_paths, lm_head: torch.Tensor, max_len: int, lookup: bool = False) -> Rows:
    """Every scored step-0 row of the stores (samples cut to ``max_len`` tokens, as training);
    ``lookup`` also gives each row the context lookup's guess."""
    from eyrie.store.shard import ShardReader

    head = lm_head.float()
    aux, final, token, label, guesses = [], [], [], [], []
    for path in store_paths:
        reader = ShardReader(path)
        for i in range(len(reader)):
            s = reader[i]
            T = min(len(s["input_ids"]), max_len)
            if T < 3:
                continue
            keep = s["loss_mask"][2:T]  # row t is scored when token t+2 is a loss-mask token
            greedy = (s["final_hidden"][1 : T - 1].float() @ head.T).argmax(-1)
            aux.append(s["aux_hidden"][: T - 2].flatten(1)[keep])
            final.append(s["final_hidden"][: T - 2][keep])
            token.append(s["input_ids"][1 : T - 1][keep])
            label.append(greedy[keep])
            if lookup:  # row t has seen x_0..x_{t+1}: guess index t + 1
                guess = torch.tensor(context_lookup(s["input_ids"][: T - 1].tolist()))
                guesses.append(guess[1:][keep])
    if not label:
        names = ", ".join(str(p) for p in store_paths) or "(no stores)"
        raise BaselineError(
            f"the stores {names} hold no position to score (a sample needs at least 3 tokens, "
            f"within train.max_len = {max_len}, with answer tokens among them): the split "
            "stored no usable sample. Its extraction errors tables and the dataset's problems "
            "table (results/data/) say why; fix the dataset and rerun"
        )
    rows = Rows(torch.cat(aux), torch.cat(final), torch.cat(token), torch.cat(label))
    if lookup:
        rows.lookup = torch.cat(guesses)
    return rows


def bigram(train: Rows, heldout: Rows, vocab_size: int) -> float:
    """Held-out accuracy of x_{t+1} -> the most frequent greedy[t+1] after it on train."""
    key = train.token * vocab_size + train.label
    pairs, counts = torch.unique(key, return_counts=True)
    tok, lab = pairs // vocab_size, pairs % vocab_size
    # for each token, the label of the largest count (ties: the lower label id): sort by
    # count descending, stably over (token, label) ascending, then keep each token's first
    order = torch.argsort(-counts, stable=True)
    order = order[torch.argsort(tok[order], stable=True)]
    first = torch.ones(len(order), dtype=torch.bool)
    first[1:] = tok[order][1:] != tok[order][:-1]
    fallback = int(torch.bincount(train.label, minlength=vocab_size).argmax())  # ties: lower id
    table = torch.full((vocab_size,), fallback, dtype=torch.long)
    table[tok[order][first]] = lab[order][first]
    return float((table[heldout.token] == heldout.label).float().mean())


class Probe(nn.Module):
    """Linear -> SiLU -> Linear over the RMS-normed input blocks, logits over the vocabulary."""

    def __init__(self, blocks: int, hidden: int, width: int, vocab: int):
        super().__init__()
        self.hidden = hidden
        self.net = nn.Sequential(
            nn.Linear(blocks * hidden, width), nn.SiLU(), nn.Linear(width, vocab)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float().unflatten(-1, (-1, self.hidden))
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # each block to unit RMS
        return self.net(x.flatten(-2))


def probe_inputs(rows: Rows, embed: torch.Tensor, with_final: bool) -> torch.Tensor:
    parts = [rows.aux, embed[rows.token].to(rows.aux.dtype)]
    if with_final:
        parts.insert(1, rows.final)
    return torch.cat(parts, dim=-1)


def probe(
    train: Rows,
    heldout: Rows,
    embed: torch.Tensor,
    *,
    with_final: bool = False,
    epochs: int = 3,
    width: int = 512,
    batch_size: int = 256,
    lr: float = 2e-3,
    seed: int = 0,
    progress: bool = False,
) -> dict:
    """Train the per-position MLP on the train rows; its held-out accuracy and wall time."""
    t0 = time.time()
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    hidden = embed.shape[1]
    x_train = probe_inputs(train, embed, with_final)
    model = Probe(x_train.shape[1] // hidden, hidden, width, embed.shape[0])
    steps = epochs * -(-len(train) // batch_size)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    # OneCycleLR's warm-up must span 2 steps or more (it divides by its length): a probe of
    # fewer than 20 steps (a small rehearsal's few hundred rows) keeps a constant rate
    one_cycle = torch.optim.lr_scheduler.OneCycleLR
    sched = one_cycle(opt, lr, total_steps=steps, pct_start=0.1) if steps >= 20 else None
    meter = bar(total=steps, desc="probe", unit="step", disable=not progress)
    for _ in range(epochs):
        for idx in torch.randperm(len(train), generator=g).split(batch_size):
            loss = F.cross_entropy(model(x_train[idx]), train.label[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            meter.update(1)
    meter.close()
    x_held = probe_inputs(heldout, embed, with_final)
    with torch.no_grad():
        hits = sum(
            int((model(x_held[s : s + 4096]).argmax(-1) == heldout.label[s : s + 4096]).sum())
            for s in range(0, len(heldout), 4096)
        )
    return {"acc": hits / len(heldout), "epochs": epochs, "width": width, "s": time.time() - t0}


def measure(
    train_stores,
    heldout_stores,
    target_dir,
    max_len: int,
    *,
    probe_epochs: int = 3,
    probe_width: int = 512,
    with_final: bool = True,
    progress: bool = False,
) -> dict:
    """Bigram and probe(s) on the stores' scored step-0 rows: the record the report shows."""
    from eyrie.target.tensors import read_target_tensors

    embed, lm_head, _ = read_target_tensors(target_dir)
    embed = embed.float()
    t0 = time.time()
    train = read_rows(train_stores, lm_head, max_len)
    held = read_rows(heldout_stores, lm_head, max_len, lookup=True)
    out = {
        "scored_train": len(train),
        "scored_heldout": len(held),
        "bigram_acc": bigram(train, held, embed.shape[0]),
        "lookup_acc": float((held.lookup == held.label).float().mean()),
        "lookup_max_n": LOOKUP_MAX_N,
        "read_s": time.time() - t0,
    }
    kw = dict(epochs=probe_epochs, width=probe_width, progress=progress)
    out["probe"] = probe(train, held, embed, **kw)
    if with_final:
        out["probe_with_final"] = probe(train, held, embed, with_final=True, **kw)
    return out
