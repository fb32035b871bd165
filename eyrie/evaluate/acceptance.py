"""Offline acceptance of a trained drafter on held-out shard stores, with no server.

Verification accepts a draft token when it equals the target's greedy choice at that position,
so drafts are scored against argmax(lm_head(final_hidden)) of the stored final states (the
target's own choice given the context), not against the stored next token (what the chat
transcript says, which the target may not have chosen). The alignment is the training unroll's
(eyrie/train/model.py): row t of draft step k predicts the token after position t+k+1 and is right
when its draft equals greedy[t+k+1]; it is scored when token t+k+2 exists and is an assistant
(loss-mask) token, the tokens a served model generates.

Definitions, for a chain of K draft tokens per verify step (k = 0..K-1):

- ``acc_k``: over every row scored at step k, the fraction whose step-k draft is right. This is
  the training metric (metrics.csv acc_k), for comparison with the training curves.
- full chains: rows whose K steps are all scored. Over them, ``chain_k`` = P(drafts 0..k all
  right), the chance that at least k+1 drafts are accepted, and ``cond_acc_k`` =
  chain_k / chain_{k-1} (chain_{-1} = 1): P(draft k right | drafts 0..k-1 right).
- accepted drafts per verify step A = the length of the right prefix, 0..K. The expected
  acceptance length without the bonus token is tau = E[A] = sum_k chain_k (the simulated
  length SpecForge reports); with it, tau + 1 = tokens emitted per verify step (the target
  always adds one token of its own: SGLang's spec_accept_length counts it).

tau + 1 weights every position alike, but a decoder starts its verify steps only where the last
one ended: after a long accepted chain it skips the easy positions, after a rejection it starts
again where drafting just failed. Where acceptance comes in runs (repetitive text, the target's
own regenerated answers), tokens per verify step in decoding is therefore below tau + 1. The
**decoding walk** replays that: in each assistant turn it starts at the turn's first draftable
row, accepts the right prefix of that row's K drafts, emits it and the bonus token, and jumps
there; ``walk_accept_length`` = tokens emitted / verify steps, bonus included, the figure
SGLang's spec_accept_length and eyrie.evaluate.speculate report for the same drafter.

``lookup_rows`` splits acc_0 by whether a context lookup (eyrie.evaluate.baselines:
context_lookup, the token after the most recent earlier occurrence of the last 4..1 tokens)
names the row's greedy token: a target that repeats itself makes most rows of the first kind,
and a drafter that has learned to copy from its context is right on most of them.

The drafts are fed the stored tokens (teacher forcing), as in training; in real decoding a
draft after an accepted one is fed that draft, which is the same token only where the data
follows the target's greedy path. eyrie.evaluate.speculate measures the real loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from eyrie.common.errors import EyrieError
from eyrie.target.greedy import greedy_tokens


class AcceptanceError(EyrieError, ValueError):
    """Inputs that cannot be evaluated together; the message names the input and the fix."""


# ---------------------------------------------------------------------------------------------
# counting


@dataclass
class AcceptanceCounts:
    """Sums over rows; add the counts of several batches, then call ``metrics``."""

    steps: int
    scored: np.ndarray = None  # (K,) rows scored at step k
    correct: np.ndarray = None  # (K,) of those, draft k right
    reachable: np.ndarray = None  # (K,) of those, the greedy token is in the draft vocabulary
    chains: int = 0  # rows with all K steps scored
    chain_correct: np.ndarray = None  # (K,) full chains with drafts 0..k all right
    samples: int = 0
    walk_steps: np.ndarray = None  # (K,) verify steps of the decoding walk with k+1 drafts
    walk_tokens: np.ndarray = None  # (K,) tokens it emitted, bonus included
    lookup_rows: int = 0  # rows scored at step 0 whose greedy token the context lookup names
    lookup_rows_correct: int = 0  # of those, the step-0 draft right

    def __post_init__(self):
        for name in ("scored", "correct", "reachable", "chain_correct", "walk_steps",
                     "walk_tokens"):  # fmt: skip
            if getattr(self, name) is None:
                setattr(self, name, np.zeros(self.steps, dtype=np.int64))

    def __add__(self, other: AcceptanceCounts) -> AcceptanceCounts:
        if other.steps != self.steps:
            raise ValueError(f"cannot add counts of {self.steps} and {other.steps} steps")
        return AcceptanceCounts(
            self.steps,
            self.scored + other.scored,
            self.correct + other.correct,
            self.reachable + other.reachable,
            self.chains + other.chains,
            self.chain_correct + other.chain_correct,
            self.samples + other.samples,
            self.walk_steps + other.walk_steps,
            self.walk_tokens + other.walk_tokens,
            self.lookup_rows + other.lookup_rows,
            self.lookup_rows_correct + other.lookup_rows_correct,
        )


def decoding_walk(hits, mask, drafts: int) -> tuple[int, int]:
    """(verify steps, tokens emitted) of decoding one sample with chains of ``drafts``.

    ``hits`` (K, T) bool, nested lists or an array: row t's step-k draft is right. ``mask`` (T,)
    bool: assistant tokens.
    Row t is a verify step's start when token t+1 was just emitted and t+2 is still to come in
    the same turn (mask[t+1] and mask[t+2]); its step-k draft is token t+k+2.
    """
    T = len(mask)
    steps = tokens = 0
    t = 0
    while t + 2 < T:
        if not (mask[t + 1] and mask[t + 2]):
            t += 1
            continue
        a = 0
        while a < drafts and t + a + 2 < T and mask[t + a + 2] and hits[a][t]:
            a += 1
        emitted = a + 1 if t + a + 2 < T and mask[t + a + 2] else a  # the bonus, if in the turn
        steps, tokens = steps + 1, tokens + max(emitted, 1)
        t += max(emitted, 1)
    return steps, tokens


def count_acceptance(
    drafts: list[torch.Tensor],
    greedy: torch.Tensor,
    loss_mask: torch.Tensor,
    in_vocab: torch.Tensor | None = None,
    lookup: torch.Tensor | None = None,
) -> AcceptanceCounts:
    """Counts for one batch.

    ``drafts[k]`` (B, T): the step-k draft of row t as a target token id. ``greedy`` (B, T): the
    target's greedy token after position t. ``loss_mask`` (B, T) bool; padding must be False.
    ``in_vocab`` (B, T) bool: greedy[t] is a draft-vocabulary token (None: not counted).
    ``lookup`` (B, T): the context lookup's guess of greedy[t], -1 for none (None: not counted).
    """
    K = len(drafts)
    B, T = greedy.shape
    mask = loss_mask.bool()
    out = AcceptanceCounts(K, samples=B)
    hits = []
    for k in range(K):
        n = max(0, T - k - 2)  # rows t with t + k + 2 < T
        scored = mask[:, k + 2 : k + 2 + n]  # row t needs token t+k+2 in the loss mask
        hit = drafts[k][:, :n].to(greedy.device) == greedy[:, k + 1 : k + 1 + n]
        out.scored[k] = int(scored.sum())
        out.correct[k] = int((hit & scored).sum())
        if in_vocab is not None:
            out.reachable[k] = int((in_vocab[:, k + 1 : k + 1 + n] & scored).sum())
        hits.append(hit)
        if k == 0 and lookup is not None:  # row t's step-0 draft and the lookup both name t+2
            copy = (lookup[:, 1 : 1 + n].to(greedy.device) == greedy[:, 1 : 1 + n]) & scored
            out.lookup_rows = int(copy.sum())
            out.lookup_rows_correct = int((copy & hit).sum())
    n = max(0, T - K - 1)  # rows that have all K steps
    chain = torch.ones(B, n, dtype=torch.bool, device=greedy.device)
    for k in range(K):
        chain &= mask[:, k + 2 : k + 2 + n]
    out.chains = int(chain.sum())
    for k in range(K):
        chain = chain & hits[k][:, :n]
        out.chain_correct[k] = int(chain.sum())
    hit_rows = np.zeros((B, K, T), dtype=bool)
    for k, hit in enumerate(hits):
        hit_rows[:, k, : hit.shape[1]] = hit.cpu().numpy()
    mask_np = mask.cpu().numpy()
    for b in range(B):
        rows, turn = hit_rows[b].tolist(), mask_np[b].tolist()  # Python scalars walk faster
        for k in range(K):
            steps, tokens = decoding_walk(rows, turn, k + 1)
            out.walk_steps[k] += steps
            out.walk_tokens[k] += tokens
    return out


@dataclass
class AcceptanceMetrics:
    steps: int
    acc: list[float]
    cond_acc: list[float]
    chain: list[float]
    reachable: list[float]
    tau: list[float] = field(default_factory=list)  # tau[K'-1]: expected accepted, K' drafts
    walk: list[float] = field(default_factory=list)  # walk[K'-1]: decoding walk, K' drafts
    scored: list[int] = field(default_factory=list)
    chains: int = 0
    samples: int = 0
    # step 0 on the rows whose greedy token the context lookup names (the target repeating its
    # context) and on the others: a drafter that copies is right on most of the former
    lookup_share: float = float("nan")
    acc0_lookup_rows: float = float("nan")
    acc0_other_rows: float = float("nan")

    @property
    def tau_with_bonus(self) -> list[float]:
        return [t + 1.0 for t in self.tau]

    def table(self):
        """One row per draft position k (a pandas DataFrame)."""
        import pandas as pd

        return pd.DataFrame(
            {
                "position": list(range(self.steps)),
                "scored": self.scored,
                "acc": self.acc,
                "cond_acc": self.cond_acc,
                "chain": self.chain,
                "reachable": self.reachable,
                "tau": self.tau,
                "tau_with_bonus": self.tau_with_bonus,
                "walk_accept_length": self.walk,
            }
        )

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "samples": self.samples,
            "scored": self.scored,
            "full_chains": self.chains,
            "acc": self.acc,
            "cond_acc": self.cond_acc,
            "chain": self.chain,
            "reachable": self.reachable,
            "tau": self.tau[-1] if self.tau else 0.0,
            "tau_with_bonus": self.tau_with_bonus[-1] if self.tau else 1.0,
            "tau_by_draft_tokens": self.tau,
            "walk_accept_length": self.walk[-1] if self.walk else 1.0,
            "walk_accept_length_by_draft_tokens": self.walk,
            "lookup_rows": {
                "share": self.lookup_share,
                "acc0": self.acc0_lookup_rows,
                "acc0_other_rows": self.acc0_other_rows,
            },
        }


def _ratio(a, b) -> float:
    return float(a) / float(b) if b else float("nan")


def metrics(c: AcceptanceCounts) -> AcceptanceMetrics:
    """acc_k, cond_acc_k, chain_k and tau for 1..K draft tokens (see the module docstring)."""
    K = c.steps
    chain = [_ratio(c.chain_correct[k], c.chains) for k in range(K)]
    cond = [_ratio(c.chain_correct[k], c.chain_correct[k - 1] if k else c.chains) for k in range(K)]
    tau = np.cumsum(np.nan_to_num(chain)).tolist() if c.chains else [0.0] * K
    return AcceptanceMetrics(
        steps=K,
        acc=[_ratio(c.correct[k], c.scored[k]) for k in range(K)],
        cond_acc=cond,
        chain=chain,
        reachable=[_ratio(c.reachable[k], c.scored[k]) for k in range(K)],
        tau=[float(t) for t in tau],
        walk=[_ratio(c.walk_tokens[k], c.walk_steps[k]) for k in range(K)],
        scored=[int(s) for s in c.scored],
        chains=int(c.chains),
        samples=int(c.samples),
        lookup_share=_ratio(c.lookup_rows, c.scored[0]) if K else float("nan"),
        acc0_lookup_rows=_ratio(c.lookup_rows_correct, c.lookup_rows),
        acc0_other_rows=_ratio(c.correct[0] - c.lookup_rows_correct, c.scored[0] - c.lookup_rows)
        if K
        else float("nan"),
    )


# ---------------------------------------------------------------------------------------------
# the trained drafter and the stores


def load_drafter(folder, device="cpu"):
    """(Drafter or DFlashDrafter in eval mode, drafter.json) from a folder eyrie train wrote."""
    from eyrie.train.model import Drafter, DrafterConfig, DrafterError
    from eyrie.train.saved import read_drafter

    try:
        meta, state = read_drafter(folder)
    except DrafterError as exc:
        raise AcceptanceError(str(exc)) from None
    weights, meta_path = Path(folder) / "model.safetensors", Path(folder) / "drafter.json"
    if meta.get("method") == "dflash":
        from eyrie.train.dflash import DFlashConfig, DFlashDrafter

        model = DFlashDrafter(DFlashConfig.from_dict(meta["config"]))
    else:
        model = Drafter(DrafterConfig.from_dict(meta["config"]))
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise AcceptanceError(
            f"{weights} does not fit the shape in {meta_path} ({exc}); the folder mixes two "
            "drafters: retrain it"
        ) from None
    return model.to(device).eval(), meta


@torch.no_grad()
def block_drafts(drafter, aux, ids, embed, lm_head, steps: int, chunk: int = 64) -> list:
    """DFlash's drafts in the unroll's layout: row t's block is anchored at t + 1 (the token
    after row t, whose state the target has not computed yet) and its slot k + 1 is the step-k
    draft of row t, the token at t + k + 2. (B, T) target ids per step, ``chunk`` rows a pass."""
    from eyrie.train.dflash import draft_logits

    if steps > drafter.config.block_size - 1:
        raise AcceptanceError(
            f"evaluate.steps {steps}: a DFlash block of {drafter.config.block_size} holds "
            f"{drafter.config.block_size - 1} drafts"
        )
    n, T = ids.shape
    anchors = torch.arange(1, T + 1, device=ids.device)
    anchors = anchors.masked_fill(anchors >= T, -1).expand(n, T)
    out = torch.zeros(steps, n, T, dtype=torch.long, device=ids.device)
    ctx_kv = drafter.context_kv(aux)  # once: every chunk of anchors reads the same context
    for s in range(0, T, chunk):
        h = drafter(aux, ids, anchors[:, s : s + chunk], embed, ctx_kv)
        d = draft_logits(h[..., : steps + 1, :], lm_head).argmax(-1)  # (n, rows, steps)
        out[:, :, s : s + chunk] = d.permute(2, 0, 1)
    return list(out)


def lookup_guesses(ids: torch.Tensor, lengths) -> torch.Tensor:
    """(B, T) the context lookup's guess of the token after each position of each padded row
    (its first ``lengths[b]`` tokens), -1 where it has none or past the row's end."""
    from eyrie.evaluate.baselines import context_lookup

    out = torch.full(ids.shape, -1, dtype=torch.long)
    for b, n in enumerate(lengths):
        n = int(n)
        out[b, :n] = torch.tensor(context_lookup(ids[b, :n].tolist()), dtype=torch.long)
    return out


def evaluate_stores(
    drafter,
    aux_layer_ids: list[int],
    target_dir,
    stores: list,
    *,
    steps: int,
    batch_size: int = 8,
    max_len: int = 2048,
    device="cpu",
    progress: bool = False,
) -> AcceptanceMetrics:
    """Run the unrolled drafter over every sample of ``stores`` and count its acceptance."""
    from eyrie.common.progress import bar
    from eyrie.store.shard import ShardDataset, ShardReader
    from eyrie.target.tensors import read_target_tensors
    from eyrie.train.data import Pad

    if steps < 1:
        raise AcceptanceError(f"evaluate.steps must be at least 1, got {steps}")
    lengths = []
    for p in stores:
        reader = ShardReader(p)
        lengths += np.diff(reader.offsets).tolist()
        have = reader.aux_layer_ids
        if list(have) != list(aux_layer_ids):
            raise AcceptanceError(
                f"{p} holds aux layers {have} but the drafter was trained on {aux_layer_ids}; "
                "evaluate with stores extracted with the drafter's capture.aux_layer_ids"
            )
    embed_w, lm_head, _ = read_target_tensors(target_dir)
    embed_w, lm_head = embed_w.to(device, torch.float32), lm_head.to(device, torch.float32)
    if embed_w.shape[0] != drafter.config.vocab_size:
        raise AcceptanceError(
            f"the target in {target_dir} has {embed_w.shape[0]} tokens, the drafter "
            f"{drafter.config.vocab_size}: it was trained for another target"
        )
    vocab_mask = drafter.t2d.to(device) if hasattr(drafter, "t2d") else None

    def embed(ids):
        return torch.nn.functional.embedding(ids, embed_w)

    dataset = ShardDataset(list(stores))
    order = sorted(range(len(dataset)), key=lambda i: lengths[i])  # like lengths pad less
    pad = Pad(max_len)
    total = AcceptanceCounts(steps)
    meter = bar(total=len(order), desc="offline acceptance", unit="sample", disable=not progress)
    for s in range(0, len(order), batch_size):
        batch = pad([dataset[i] for i in order[s : s + batch_size]])
        ids = batch["input_ids"].to(device)
        aux = batch["aux_hidden"].to(device, torch.float32)
        greedy = greedy_tokens(batch["final_hidden"].to(device, torch.float32), lm_head)
        lookup = lookup_guesses(ids.cpu(), batch["lengths"])
        if vocab_mask is None:  # DFlash: a block per row, over the full vocabulary
            drafts = block_drafts(drafter, aux, ids, embed, lm_head, steps)
            reachable = torch.ones_like(greedy, dtype=torch.bool)
        else:
            logits = drafter(aux, ids, embed, steps)
            drafts = [drafter.draft_to_target(lg.argmax(-1)) for lg in logits]
            reachable = vocab_mask[greedy]
        mask = batch["loss_mask"].to(device)
        total = total + count_acceptance(drafts, greedy, mask, reachable, lookup)
        meter.update(len(batch["lengths"]))
    meter.close()
    return metrics(total)
