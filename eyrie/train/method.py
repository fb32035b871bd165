"""The drafter families training knows (train.method), behind the few calls the loop makes.

- ``eagle3``: one decoder layer unrolled ttt_steps times (model.py, loss.py);
- ``dflash``: a block of block_size - 1 drafts in one pass (dflash.py, dflash_loss.py).

Either way a batch gives per-position sums (ce, correct, chain, chain_starts, counts): column k
is unroll step k, or block slot k + 1. The loop, the checkpoints, the metrics and the held-out
scores need nothing else.
"""

from __future__ import annotations

import math

import torch

from eyrie.target.tensors import read_target_norm
from eyrie.train.data import seeded
from eyrie.train.dflash import DFlashConfig, DFlashDrafter
from eyrie.train.dflash_loss import (
    block_terms,
    eligible,
    every_anchor,
    sample_anchors,
    shared_inputs,
)
from eyrie.train.loss import forward_batch, step_counts
from eyrie.train.model import Drafter, DrafterConfig

METHODS = ("eagle3", "dflash")


def positions(settings: dict) -> int:
    """Draft positions scored: the unroll's steps, or a block's drafts."""
    if settings["method"] == "dflash":
        return int(settings["dflash"]["block_size"]) - 1
    return int(settings["ttt_steps"])


def position_weight(settings: dict) -> float:
    """Position k's loss weighs this ** k: step_weight, or exp(-1 / gamma) for DFlash."""
    if settings["method"] == "dflash":
        return math.exp(-1.0 / float(settings["dflash"]["gamma"]))
    return float(settings["step_weight"])


def build_model(settings: dict, target_cfg: dict, aux_ids, vocab, lm_head, target_dir):
    """The untrained drafter of train.method, initialized as its settings say."""
    s = settings
    torch.manual_seed(int(s["seed"]))
    if s["method"] == "dflash":
        cfg = DFlashConfig.from_target(
            target_cfg, num_aux=len(aux_ids), dflash=s["dflash"], overrides=s["drafter"]
        )
        model = DFlashDrafter(cfg)
        if s["init_lm_head"] == "target":  # the target's head reads the drafter's output
            model.init_norm_from_target(read_target_norm(target_dir))
        return model
    cfg = DrafterConfig.from_target(
        target_cfg, num_aux=len(aux_ids), draft_vocab_size=vocab.size, overrides=s["drafter"]
    )
    model = Drafter(cfg)
    model.set_vocab(vocab.d2t, vocab.t2d)
    if s["init_lm_head"] != "random":  # the target's output space (Drafter.init_head_from_target)
        norm = read_target_norm(target_dir) if s["init_lm_head"] == "target" else None
        model.init_head_from_target(lm_head, norm)
    if s["attn_init"] == "self":
        model.init_attention_to_self()
    return model


def batch_terms(model, inner, head, batch: dict, settings: dict, dtype, keys=()) -> dict:
    """Per-position sums of one batch; ``model`` may be DDP's wrapper of ``inner``.

    DFlash draws its anchors from a generator seeded by ``keys`` (seed, step, rank), so a
    resumed run draws what an uninterrupted one would have."""
    if settings["method"] == "dflash":
        ok = eligible(batch["loss_mask"])
        n = int(settings["dflash"]["anchors"])
        anchors = sample_anchors(ok, n, seeded(int(settings["seed"]), *keys))
        return block_terms(model, head, batch, anchors, dtype)
    K = int(settings["ttt_steps"])
    terms = forward_batch(model, head, batch, K, dtype, inner.d2t, settings["loss"])
    return {**terms, "counts": step_counts(batch["loss_mask"], K).to(batch["loss_mask"].device)}


@torch.no_grad()
def heldout_terms(model, head, batch: dict, settings: dict, dtype) -> dict:
    """Per-position sums over a held-out batch: every anchor for DFlash, in chunks."""
    if settings["method"] != "dflash":
        return batch_terms(model, model, head, batch, settings, dtype)
    anchors = every_anchor(eligible(batch["loss_mask"]))
    n = int(settings["dflash"]["anchors"])
    shared = shared_inputs(model, head, batch, dtype)
    total: dict = {}
    for start in range(0, anchors.shape[1], n):
        t = block_terms(model, head, batch, anchors[:, start : start + n], dtype, shared)
        t.pop("accepted")
        total = {k: total.get(k, 0) + v for k, v in t.items()}
    return total
