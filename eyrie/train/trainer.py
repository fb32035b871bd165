"""Train the drafter on shard stores: AdamW, warm-up + cosine, clipping, exact resume, DDP.

One optimizer step takes a global batch of ``batch_size`` samples, the same ones for any number
of processes and after any resume (see GlobalBatches); process r of W takes every W-th sample
of it. Losses are sums over scored positions divided by the
global count of each unroll step (all-reduced before the backward pass), times W to undo DDP's
gradient averaging, so W processes compute the gradient one process would.

The loss of step k is the soft cross-entropy between the drafter's distribution and the
target's, both over the draft vocabulary, weighted by ``step_weight ** k``; the alignment of
rows, tokens and targets is drawn in eyrie/train/model.py. acc_k is the fraction of scored rows
whose step-k draft token (mapped to a target id) is the target's greedy token over its full
vocabulary.

Resume is exact: see eyrie/train/checkpoint.py. The pieces, one file each:

- settings.py: the defaults (the config schema's) and TrainError;
- distributed.py: processes, device, compute dtype;
- data.py: the global batches, the collate, the stores' agreement;
- loss.py: the per-step loss and accuracies; optim.py: AdamW and its schedule;
- checkpoint.py: checkpoints, the run identity, the metrics file;
- heldout.py: held-out accuracy; model.py: the drafter.

This module builds a run from them (build), takes the optimizer steps (loop) and writes the
trained drafter (write_outputs).
"""

from __future__ import annotations

import csv
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from eyrie.common import atomic
from eyrie.common.hf_config import text_config
from eyrie.common.provenance import file_sha256
from eyrie.target.tensors import read_target_tensors
from eyrie.train.checkpoint import (
    checkpoints,
    finish_work,
    load_checkpoint,
    metric_columns,
    prepare_work,
    run_identity,
    save_checkpoint,
    state_dict_cpu,
    truncate_metrics,
)
from eyrie.train.data import (
    GlobalBatches,
    Pad,
    check_stores,
    sample_lengths,
    store_identity,
    to_device,
)
from eyrie.train.distributed import Dist, compute_dtype, setup_processes
from eyrie.train.heldout import evaluate
from eyrie.train.loss import weighted_loss
from eyrie.train.method import batch_terms, build_model, position_weight, positions
from eyrie.train.model import TargetHead
from eyrie.train.optim import lr_lambda, make_optimizer
from eyrie.train.settings import TrainError, settings_with_defaults
from eyrie.train.vocab import load as load_vocab

log = logging.getLogger(__name__)


@dataclass
class Setup:
    """Everything a run needs, checked for agreement before any step is taken."""

    dist: Dist
    device: torch.device
    dtype: torch.dtype | None
    settings: dict
    model: torch.nn.Module  # Drafter or DFlashDrafter (train.method)
    head: TargetHead
    aux_ids: list[int]
    target_cfg: dict
    train_identity: list[dict]


def build(train_stores, heldout_stores, target_dir, vocab_path, settings: dict) -> Setup:
    """Check stores, target and vocabulary against each other; build the drafter and head."""
    s = settings
    dist, device = setup_processes(s["device"])
    dtype = compute_dtype(s["precision"], device)

    train_id, held_id = store_identity(train_stores), store_identity(heldout_stores)
    target_cfg = json.loads((Path(target_dir) / "config.json").read_text())
    aux_ids = check_stores(train_id + held_id, target_cfg, "train/heldout")
    vocab = load_vocab(vocab_path)
    target_vocab = int(text_config(target_cfg)["vocab_size"])
    if vocab.vocab_size != target_vocab:
        raise TrainError(
            f"{vocab_path} is for a vocabulary of {vocab.vocab_size} tokens but the target has "
            f"{target_vocab}; rebuild the draft vocabulary for this target"
        )
    embed, lm_head, _ = read_target_tensors(target_dir)
    head_dtype = torch.bfloat16 if dtype is not None else torch.float32
    head = TargetHead(
        embed.to(device, head_dtype), lm_head.to(device, head_dtype), vocab.draft_tokens.to(device)
    )
    model = build_model(s, target_cfg, aux_ids, vocab, lm_head, target_dir)
    return Setup(dist, device, dtype, s, model.to(device), head, aux_ids, target_cfg, train_id)


def train(
    *,
    train_stores: list,
    heldout_stores: list,
    target_dir,
    vocab_path,
    out_dir,
    work_dir=None,
    settings: dict | None = None,
    progress: bool = True,
) -> dict:
    """Train (or resume), then write {out}/drafter/, {out}/metrics.csv and {out}/heldout.json."""
    from eyrie.store.shard import ShardDataset

    s = settings_with_defaults(settings)
    out, work = Path(out_dir), Path(work_dir or Path(out_dir) / "work")
    run = build(train_stores, heldout_stores, target_dir, vocab_path, s)
    dist, model = run.dist, run.model
    log.info("process %d of %d on %s", dist.rank, dist.world, run.device)

    train_ds = ShardDataset(list(train_stores))
    steps_per_epoch = GlobalBatches.steps_per_epoch(len(train_ds), int(s["batch_size"]))
    total = int(s["max_steps"] or int(s["epochs"]) * steps_per_epoch)
    opt = make_optimizer(model, s)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lr_lambda(int(s["warmup_steps"]), total, float(s["min_lr_ratio"]))
    )

    identity = run_identity(s, model.config, run.train_identity, vocab_path, target_dir)
    resume = prepare_work(work, identity) if dist.main else None
    dist.barrier()
    if not dist.main:  # rank 0 has removed stale checkpoints: the newest one left is the one
        found = checkpoints(work)
        resume = found[-1] if found else None
    start = load_checkpoint(resume, model, opt, sched, run.device) if resume else 0
    if dist.main:
        truncate_metrics(work / "metrics.csv", start, metric_columns(positions(s)))
        log.info("training %d steps from step %d (%s)", total, start, resume or "fresh start")

    batches = GlobalBatches(
        sample_lengths(train_stores, int(s["max_len"])),
        int(s["batch_size"]),
        int(s["seed"]),
        start,
        total,
        dist,
    )
    loader = DataLoader(
        train_ds,
        batch_sampler=batches,
        collate_fn=Pad(int(s["max_len"])),
        num_workers=int(s["num_workers"]),
        pin_memory=run.device.type == "cuda",
    )
    elapsed, tokens = loop(
        run, loader, opt, sched, start, total, steps_per_epoch, work, identity, progress
    )

    held = None
    if heldout_stores:
        held = evaluate(
            model, run.head, ShardDataset(list(heldout_stores)), s, run.device, run.dtype, dist
        )
    if dist.main:
        write_outputs(run, out, work, total, identity, held, target_dir, vocab_path)
        finish_work(work)
    dist.barrier()
    return {
        "steps": total,
        "resumed_from": start,
        "tokens_per_s": tokens / elapsed if elapsed > 0 and tokens else None,
        "heldout": held,
    }


def loop(run: Setup, loader, opt, sched, start, total, steps_per_epoch, work, identity, progress):
    """The optimizer steps from ``start`` to ``total``; returns (seconds, tokens trained on)."""
    from torch.nn.parallel import DistributedDataParallel

    from eyrie.common.progress import bar as progress_bar

    s, dist, model, K = run.settings, run.dist, run.model, positions(run.settings)
    ddp = model
    if dist.world > 1:
        ids = [run.device.index] if run.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids)
    weight = position_weight(s)
    weights = weight ** torch.arange(K, dtype=torch.float64)
    f = open(work / "metrics.csv", "a", newline="") if dist.main else None
    writer = csv.DictWriter(f, fieldnames=metric_columns(K)) if f else None
    bar = progress_bar(
        total=total, initial=start, desc="train", unit="step", disable=not (progress and dist.main)
    )
    t0, tokens = time.time(), 0
    try:
        for step, batch in zip(range(start, total), loader, strict=False):
            batch = to_device(batch, run.device, run.dtype)
            terms = batch_terms(ddp, model, run.head, batch, s, run.dtype, (step, dist.rank))
            counts = dist.sum(terms["counts"].double()).cpu()
            loss = weighted_loss(terms["ce"], counts, weight, dist.world)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float(s["grad_clip"]))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()

            real = batch["lengths"].sum().double().view(1).cpu()
            stats = torch.cat([terms["ce"].detach().double().cpu(), terms["correct"].cpu(), real])
            stats = dist.sum(stats.to(run.device)).cpu()
            step_loss = stats[:K] / counts.clamp(min=1)
            step_acc = stats[K : 2 * K] / counts.clamp(min=1)
            tokens += int(stats[-1])
            if writer:
                row = {
                    "step": step + 1,
                    "epoch": step // steps_per_epoch,
                    "lr": f"{lr:.6g}",
                    "loss": f"{float((weights * step_loss).sum()):.6f}",
                    "grad_norm": f"{float(grad_norm):.6f}",
                    "tokens": int(stats[-1]),
                    "elapsed_s": f"{time.time() - t0:.3f}",
                }
                row.update({f"loss_{k}": f"{float(step_loss[k]):.6f}" for k in range(K)})
                row.update({f"acc_{k}": f"{float(step_acc[k]):.6f}" for k in range(K)})
                writer.writerow(row)
                f.flush()
                bar.set_postfix(loss=row["loss"], acc0=row["acc_0"], refresh=False)
            bar.update(1)
            if (step + 1) % int(s["checkpoint_every"]) == 0 or step + 1 == total:
                if dist.main:
                    keep = int(s["keep_checkpoints"])
                    save_checkpoint(work, step + 1, model, opt, sched, identity, keep)
                dist.barrier()
    finally:
        bar.close()
        if f:
            f.close()
    return time.time() - t0, tokens


def write_outputs(run: Setup, out: Path, work: Path, total, identity, held, target_dir, vocab):
    """The trained drafter (weights, then drafter.json last), held-out accuracy and metrics."""
    from safetensors.torch import save_file

    drafter_dir = out / "drafter"
    with atomic.atomic_path(drafter_dir / "model.safetensors") as tmp:
        save_file(state_dict_cpu(run.model), str(tmp))
    K = positions(run.settings)
    atomic.write_json(
        out / "heldout.json", {"ttt_steps": K, "checkpoint_step": total, **(held or {})}
    )
    atomic.copy(work / "metrics.csv", out / "metrics.csv")
    tc = run.target_cfg
    text = text_config(tc)
    target = {
        "path": str(target_dir),
        "architectures": tc.get("architectures", []),
        "num_hidden_layers": int(text["num_hidden_layers"]),
        "hidden_size": int(text["hidden_size"]),
        "vocab_size": int(text["vocab_size"]),
        "config_sha256": file_sha256(Path(target_dir) / "config.json"),
        "weights_sha256": run.train_identity[0]["weights_sha256"],
    }
    target.update(
        {k: text[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in text}
    )
    atomic.write_json(
        drafter_dir / "drafter.json",
        {
            "format": "eyrie-drafter",
            "version": 1,
            "method": run.settings["method"],
            "config": run.model.config.to_dict(),
            "aux_layer_ids": run.aux_ids,
            "layer_convention": "output",
            "target": target,
            "draft_vocab": {"path": str(vocab), "sha256": file_sha256(Path(vocab))},
            "train": {"steps": total, "identity": identity, "settings": run.settings},
            "heldout": held,
        },
    )
