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

Resume: a checkpoint (weights in safetensors; optimizer, scheduler, step and RNG state in a
torch.save file read back with weights_only=True) is written to a temp folder and renamed into
place every ``checkpoint_every`` steps. A rerun with the same settings and data continues from
the newest one and truncates the metrics to it, so a killed run resumed equals an unbroken one;
a rerun with other settings starts again.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from eyrie.common import atomic
from eyrie.common.errors import EyrieError
from eyrie.train.loss import (  # noqa: F401 - scored_rows, soft_cross_entropy: part of this API
    scored_rows,
    soft_cross_entropy,
    step_counts,
    ttt_terms,
    weighted_loss,
)
from eyrie.train.model import (
    Drafter,
    DrafterConfig,
    TargetHead,
    read_target_norm,
    read_target_tensors,
)
from eyrie.train.optim import lr_lambda, make_optimizer
from eyrie.train.vocab import load as load_vocab

log = logging.getLogger(__name__)

DEFAULTS = {
    "epochs": 2,
    "max_steps": None,
    "batch_size": 16,
    "max_len": 2048,
    "ttt_steps": 7,
    "step_weight": 0.8,
    "lr": 1e-4,
    "min_lr_ratio": 0.1,
    "warmup_steps": 20,
    "weight_decay": 0.0,
    "betas": [0.9, 0.95],
    "grad_clip": 0.5,
    "seed": 0,
    "precision": "auto",
    "device": "auto",
    "processes": 1,
    "rdzv_host": None,
    "num_workers": 1,
    "checkpoint_every": 50,
    "keep_checkpoints": 2,
    "init_lm_head": "target",
    "head_lr_scale": 1.0,
    "attn_init": "default",
    "loss": "soft",
    "drafter": {},
}
# settings that do not change the numbers: a resume may change them
RUNTIME_KEYS = ("num_workers", "checkpoint_every", "keep_checkpoints", "processes", "rdzv_host")


class TrainError(EyrieError, RuntimeError):
    """Training cannot start or continue as asked; the message names the input and the fix."""


# ---------------------------------------------------------------------------------------------
# settings, processes, devices


def settings_with_defaults(settings: dict | None) -> dict:
    out = json.loads(json.dumps(DEFAULTS))
    for key, value in (settings or {}).items():
        if key not in DEFAULTS:
            raise TrainError(f"train.{key} is not a training setting; known: {sorted(DEFAULTS)}")
        out[key] = value
    return out


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def init_distributed(device_kind: str) -> Dist:
    """The process group of a torchrun launch (WORLD_SIZE > 1); a single process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def pick_device(name: str, d: Dist) -> torch.device:
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise TrainError("train.device is 'cuda' but torch sees no CUDA device; use auto")
        torch.cuda.set_device(d.local_rank)
        return torch.device("cuda", d.local_rank)
    if name not in ("auto", "cpu"):
        raise TrainError(f"train.device {name!r} is not one of auto, cpu, cuda")
    return torch.device("cpu")


def compute_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for plain fp32 (the default on CPU, where bf16 is slow)."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    if precision in ("fp32", "auto"):
        return None
    raise TrainError(f"train.precision {precision!r} is not one of auto, fp32, bf16")


# ---------------------------------------------------------------------------------------------
# data


class GlobalBatches:
    """This process's share of each global batch, from optimizer step ``start`` to ``stop``.

    Epoch e is a permutation seeded by (seed, e), cut into groups of ``bucket`` batches; each
    group is sorted by length, cut into batches (little padding), and its batches are visited
    in a seeded random order. Everything follows from (seed, step), so a resumed run and any
    number of processes see the same global batches; process r of W takes every W-th sample.
    """

    def __init__(
        self, lengths, batch_size: int, seed: int, start: int, stop: int, d: Dist, bucket: int = 32
    ):
        if len(lengths) == 0:
            raise TrainError("the train stores hold no samples; check the extract stage")
        if batch_size < d.world:
            raise TrainError(
                f"train.batch_size {batch_size} is smaller than the {d.world} processes; "
                "raise it so each process gets a sample"
            )
        self.lengths = torch.as_tensor(lengths, dtype=torch.int64)
        self.bs, self.seed, self.bucket, self.d = batch_size, seed, bucket, d
        self.start, self.stop = start, stop

    @staticmethod
    def steps_per_epoch(n: int, batch_size: int) -> int:
        return max(1, n // batch_size)

    def global_batch(self, step: int) -> list[int]:
        n, bs = len(self.lengths), self.bs
        spe = self.steps_per_epoch(n, bs)
        epoch, i = divmod(step, spe)
        perm = torch.randperm(n, generator=seeded(self.seed, epoch))[: spe * bs]
        group, within = divmod(i, self.bucket)
        chunk = perm[group * self.bucket * bs : (group + 1) * self.bucket * bs]
        chunk = chunk[torch.argsort(self.lengths[chunk], stable=True)]
        batches = list(chunk.split(bs))
        order = torch.randperm(len(batches), generator=seeded(self.seed, epoch, group))
        return batches[int(order[within])].tolist()

    def __iter__(self):
        for step in range(self.start, self.stop):
            yield self.global_batch(step)[self.d.rank :: self.d.world]

    def __len__(self) -> int:
        return max(0, self.stop - self.start)


def seeded(*keys: int) -> torch.Generator:
    """A generator seeded by a tuple of ints (no two tuples share a stream in practice)."""
    digest = hashlib.sha256(repr(tuple(int(k) for k in keys)).encode()).hexdigest()
    return torch.Generator().manual_seed(int(digest[:15], 16))


def sample_lengths(paths, max_len: int) -> list[int]:
    from eyrie.store.shard import ShardReader

    out: list[int] = []
    for p in paths:
        offsets = ShardReader(p).offsets
        out += [min(int(b - a), max_len) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    return out


class Pad:
    """Collate samples into right-padded tensors, each cut to ``max_len`` tokens."""

    def __init__(self, max_len: int):
        self.max_len = max_len

    def __call__(self, samples: list[dict]) -> dict:
        n = [min(len(s["input_ids"]), self.max_len) for s in samples]
        B, T = len(samples), max(n)
        k, H = samples[0]["aux_hidden"].shape[1:]
        out = {
            "lengths": torch.tensor(n, dtype=torch.long),
            "input_ids": torch.zeros(B, T, dtype=torch.long),
            "loss_mask": torch.zeros(B, T, dtype=torch.bool),
            "aux_hidden": torch.zeros(B, T, k, H, dtype=torch.bfloat16),
            "final_hidden": torch.zeros(B, T, H, dtype=torch.bfloat16),
        }
        for b, (s, L) in enumerate(zip(samples, n, strict=True)):
            for name in ("input_ids", "loss_mask", "aux_hidden", "final_hidden"):
                out[name][b, :L] = s[name][:L]
        return out


def store_identity(paths) -> list[dict]:
    """What a store holds, cheaply: its commit record and its aux layer ids."""
    from eyrie.store.shard import ShardReader

    out = []
    for p in paths:
        r = ShardReader(p)
        commit = json.loads((Path(p) / "commit.json").read_text())
        out.append(
            {
                "path": str(p),
                "samples": len(r),
                "tokens": r.num_tokens,
                "sample_ids_sha256": commit.get("sample_ids_sha256"),
                "aux_layer_ids": r.aux_layer_ids,
                "hidden_size": r.hidden_size,
                "weights_sha256": r.attrs.get("provenance", {}).get("weights_sha256"),
            }
        )
    return out


def check_stores(identity: list[dict], target_cfg: dict, what: str) -> list[int]:
    """The stores' common aux layer ids, once every store agrees with the others and the target."""
    text = target_cfg.get("text_config", target_cfg)
    first = identity[0]
    for s in identity:
        if s["aux_layer_ids"] != first["aux_layer_ids"]:
            raise TrainError(
                f"{what} stores disagree on aux layer ids: {first['path']} has "
                f"{first['aux_layer_ids']}, {s['path']} has {s['aux_layer_ids']}; re-extract them "
                "with one capture.aux_layer_ids"
            )
        if s["hidden_size"] != int(text["hidden_size"]):
            raise TrainError(
                f"{s['path']} has hidden size {s['hidden_size']} but the target's is "
                f"{text['hidden_size']}: the store comes from another model; re-extract it"
            )
        if s["weights_sha256"] != first["weights_sha256"]:
            raise TrainError(
                f"{what} stores were extracted from different target weights ({first['path']} vs "
                f"{s['path']}); re-extract them from one target"
            )
    return list(first["aux_layer_ids"])


# ---------------------------------------------------------------------------------------------
# checkpoints


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def checkpoints(work: Path) -> list[Path]:
    found = [p for p in work.glob("ckpt-*") if p.is_dir() and (p / "meta.json").is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def save_checkpoint(work: Path, step: int, model, opt, sched, identity: str, keep: int) -> Path:
    """Weights (safetensors), optimizer/scheduler/RNG (torch.save), then rename into place."""
    from safetensors.torch import save_file

    final = work / f"ckpt-{step:07d}"
    tmp = work / f".ckpt-{step:07d}.{uuid.uuid4().hex}.tmp"
    tmp.mkdir(parents=True)
    try:
        save_file(state_dict_cpu(model), str(tmp / "model.safetensors"))
        state = {
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "step": step,
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }
        torch.save(state, tmp / "state.pt")
        (tmp / "meta.json").write_text(json.dumps({"step": step, "identity": identity}))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    for old in checkpoints(work)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, model, opt, sched, device) -> int:
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(path / "model.safetensors"), device=str(device)))
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng_cpu"])
    if state["rng_cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng_cuda"])
    return int(state["step"])


def state_dict_cpu(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in unwrap(model).state_dict().items()}


def unwrap(model):
    return model.module if hasattr(model, "module") else model


# ---------------------------------------------------------------------------------------------
# metrics


def metric_columns(steps: int) -> list[str]:
    return (
        ["step", "epoch", "lr", "loss", "grad_norm", "tokens"]
        + [f"loss_{k}" for k in range(steps)]
        + [f"acc_{k}" for k in range(steps)]
        + ["elapsed_s"]
    )


def truncate_metrics(path: Path, last_step: int, columns: list[str]) -> None:
    """Keep the rows up to ``last_step`` (a resume recomputes the rest), atomically."""
    rows = []
    if path.is_file():
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames == columns:
                rows = [r for r in reader if int(r["step"]) <= last_step]
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# the loop


def to_device(batch: dict, device, dtype) -> dict:
    out = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    if dtype is None:  # fp32 compute: the bf16 activations are upcast once here
        out["aux_hidden"] = out["aux_hidden"].float()
        out["final_hidden"] = out["final_hidden"].float()
    return out


def forward_batch(model, head: TargetHead, batch: dict, steps: int, dtype, d2t, loss="soft"):
    probs, greedy = head.targets(batch["final_hidden"])
    with torch.autocast(batch["input_ids"].device.type, dtype=dtype, enabled=dtype is not None):
        logits = model(batch["aux_hidden"], batch["input_ids"], head.embed, steps)
    return ttt_terms(logits, probs, greedy, batch["loss_mask"], d2t, loss)


@torch.no_grad()
def evaluate(model, head, dataset, settings: dict, device, dtype, d: Dist) -> dict:
    """Held-out loss, acc_k and chain accuracy per unroll step over every sample of ``dataset``.

    chain_acc_k is the fraction of chain starts (rows whose step-0 draft is scored) whose
    drafts of steps 0..k are all right: the chance that k+1 drafted tokens are accepted.
    """
    model.eval()
    steps = settings["ttt_steps"]
    lengths = sample_lengths(dataset.paths, settings["max_len"])
    mine = sorted(range(d.rank, len(dataset), d.world), key=lambda i: lengths[i])
    bs = max(1, settings["batch_size"] // d.world)
    loader = DataLoader(
        dataset,
        batch_sampler=[mine[i : i + bs] for i in range(0, len(mine), bs)],
        collate_fn=Pad(settings["max_len"]),
        num_workers=settings["num_workers"],
    )
    inner = unwrap(model)
    sums = torch.zeros(4 * steps + 2, dtype=torch.float64)
    for batch in loader:
        batch = to_device(batch, device, dtype)
        t = forward_batch(inner, head, batch, steps, dtype, inner.d2t, settings["loss"])
        counts = step_counts(batch["loss_mask"], steps)
        parts = [t["ce"].double(), t["correct"], t["chain"], counts, t["chain_starts"].view(1)]
        parts.append(torch.tensor([len(batch["input_ids"])], dtype=torch.float64))
        sums += torch.cat([x.cpu() for x in parts])
    sums = d.sum(sums.to(device)).cpu()
    model.train()
    ce, correct, chain, counts = (
        sums[:steps],
        sums[steps : 2 * steps],
        sums[2 * steps : 3 * steps],
        sums[3 * steps : 4 * steps],
    )
    starts, samples = float(sums[4 * steps]), int(sums[4 * steps + 1])
    safe = counts.clamp(min=1)
    chain_acc = (chain / max(starts, 1.0)).tolist()
    return {
        "samples": samples,
        "scored": [int(c) for c in counts],
        "loss": (ce / safe).tolist(),
        "acc": (correct / safe).tolist(),
        "chain_acc": chain_acc,
        "step0_acc": float(correct[0] / safe[0]),
        "accept_length_estimate": 1.0 + sum(chain_acc),
    }


def run_identity(settings: dict, cfg: DrafterConfig, stores: list[dict], vocab_path, target_dir):
    """A hash of everything that decides the numbers; checkpoints of another identity are stale."""
    kept = {k: v for k, v in settings.items() if k not in RUNTIME_KEYS}
    blob = {
        "settings": kept,
        "drafter": cfg.to_dict(),
        "stores": [{k: v for k, v in s.items() if k != "path"} for s in stores],
        "vocab_sha256": _sha256_file(Path(vocab_path)),
        "target_config_sha256": _sha256_file(Path(target_dir) / "config.json"),
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def prepare_work(work: Path, identity: str) -> Path | None:
    """The checkpoint to resume from, after clearing temp folders and stale checkpoints."""
    work.mkdir(parents=True, exist_ok=True)
    for tmp in work.glob(".ckpt-*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)
    found = checkpoints(work)
    if not found:
        return None
    meta = json.loads((found[-1] / "meta.json").read_text())
    if meta.get("identity") == identity:
        return found[-1]
    log.warning("%s holds checkpoints of other settings or data; starting again", work)
    for p in found:
        shutil.rmtree(p, ignore_errors=True)
    return None


@dataclass
class Setup:
    """Everything a run needs, checked for agreement before any step is taken."""

    d: Dist
    device: torch.device
    dtype: torch.dtype | None
    settings: dict
    model: Drafter
    head: TargetHead
    aux_ids: list[int]
    target_cfg: dict
    train_identity: list[dict]


def build(train_stores, heldout_stores, target_dir, vocab_path, settings: dict) -> Setup:
    """Check stores, target and vocabulary against each other; build the drafter and head."""
    s = settings
    want = s["device"]
    on_gpu = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    d = init_distributed("cuda" if on_gpu else "cpu")
    device = pick_device(want, d)
    dtype = compute_dtype(s["precision"], device)

    train_id, held_id = store_identity(train_stores), store_identity(heldout_stores)
    target_cfg = json.loads((Path(target_dir) / "config.json").read_text())
    aux_ids = check_stores(train_id + held_id, target_cfg, "train/heldout")
    vocab = load_vocab(vocab_path)
    cfg = DrafterConfig.from_target(
        target_cfg, num_aux=len(aux_ids), draft_vocab_size=vocab.size, overrides=s["drafter"]
    )
    if vocab.vocab_size != cfg.vocab_size:
        raise TrainError(
            f"{vocab_path} is for a vocabulary of {vocab.vocab_size} tokens but the target has "
            f"{cfg.vocab_size}; rebuild the draft vocabulary for this target"
        )
    embed, lm_head, _ = read_target_tensors(target_dir)
    head_dtype = torch.bfloat16 if dtype is not None else torch.float32
    head = TargetHead(
        embed.to(device, head_dtype), lm_head.to(device, head_dtype), vocab.draft_tokens.to(device)
    )
    torch.manual_seed(int(s["seed"]))
    model = Drafter(cfg)
    model.set_vocab(vocab.d2t, vocab.t2d)
    if s["init_lm_head"] != "random":  # the target's output space (Drafter.init_head_from_target)
        norm = read_target_norm(target_dir) if s["init_lm_head"] == "target" else None
        model.init_head_from_target(lm_head, norm)
    if s["attn_init"] == "self":
        model.init_attention_to_self()
    return Setup(d, device, dtype, s, model.to(device), head, aux_ids, target_cfg, train_id)


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
    d, model = run.d, run.model
    log.info("process %d of %d on %s", d.rank, d.world, run.device)

    train_ds = ShardDataset(list(train_stores))
    spe = GlobalBatches.steps_per_epoch(len(train_ds), int(s["batch_size"]))
    total = int(s["max_steps"] or int(s["epochs"]) * spe)
    opt = make_optimizer(model, s)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lr_lambda(int(s["warmup_steps"]), total, float(s["min_lr_ratio"]))
    )

    identity = run_identity(s, model.config, run.train_identity, vocab_path, target_dir)
    resume = prepare_work(work, identity) if d.main else None
    d.barrier()
    if not d.main:  # rank 0 has removed stale checkpoints: the newest one left is the one
        found = checkpoints(work)
        resume = found[-1] if found else None
    start = load_checkpoint(resume, model, opt, sched, run.device) if resume else 0
    if d.main:
        truncate_metrics(work / "metrics.csv", start, metric_columns(int(s["ttt_steps"])))
        log.info("training %d steps from step %d (%s)", total, start, resume or "fresh start")

    batches = GlobalBatches(
        sample_lengths(train_stores, int(s["max_len"])),
        int(s["batch_size"]),
        int(s["seed"]),
        start,
        total,
        d,
    )
    loader = DataLoader(
        train_ds,
        batch_sampler=batches,
        collate_fn=Pad(int(s["max_len"])),
        num_workers=int(s["num_workers"]),
        pin_memory=run.device.type == "cuda",
    )
    elapsed, tokens = loop(run, loader, opt, sched, start, total, spe, work, identity, progress)

    held = None
    if heldout_stores:
        held = evaluate(
            model, run.head, ShardDataset(list(heldout_stores)), s, run.device, run.dtype, d
        )
    if d.main:
        write_outputs(run, out, work, total, identity, held, target_dir, vocab_path)
    d.barrier()
    return {
        "steps": total,
        "resumed_from": start,
        "tokens_per_s": tokens / elapsed if elapsed > 0 and tokens else None,
        "heldout": held,
    }


def loop(run: Setup, loader, opt, sched, start, total, spe, work, identity, progress):
    """The optimizer steps from ``start`` to ``total``; returns (seconds, tokens trained on)."""
    from torch.nn.parallel import DistributedDataParallel
    from tqdm import tqdm

    s, d, model, K = run.settings, run.d, run.model, int(run.settings["ttt_steps"])
    ddp = model
    if d.world > 1:
        ids = [run.device.index] if run.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids)
    weights = float(s["step_weight"]) ** torch.arange(K, dtype=torch.float64)
    f = open(work / "metrics.csv", "a", newline="") if d.main else None
    writer = csv.DictWriter(f, fieldnames=metric_columns(K)) if f else None
    bar = tqdm(total=total, initial=start, disable=not (progress and d.main), unit="step")
    t0, tokens = time.time(), 0
    try:
        for step, batch in zip(range(start, total), loader, strict=False):
            batch = to_device(batch, run.device, run.dtype)
            counts = d.sum(step_counts(batch["loss_mask"], K).to(run.device)).cpu()
            terms = forward_batch(ddp, run.head, batch, K, run.dtype, model.d2t, s["loss"])
            loss = weighted_loss(terms["ce"], counts, float(s["step_weight"]), d.world)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float(s["grad_clip"]))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()

            real = batch["lengths"].sum().double().view(1).cpu()
            stats = torch.cat([terms["ce"].detach().double().cpu(), terms["correct"].cpu(), real])
            stats = d.sum(stats.to(run.device)).cpu()
            step_loss = stats[:K] / counts.clamp(min=1)
            step_acc = stats[K : 2 * K] / counts.clamp(min=1)
            tokens += int(stats[-1])
            if writer:
                row = {
                    "step": step + 1,
                    "epoch": step // spe,
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
                if d.main:
                    keep = int(s["keep_checkpoints"])
                    save_checkpoint(work, step + 1, model, opt, sched, identity, keep)
                d.barrier()
    finally:
        bar.close()
        if f:
            f.close()
    return time.time() - t0, tokens


def write_outputs(run: Setup, out: Path, work: Path, total, identity, held, target_dir, vocab):
    """The trained drafter (weights, then drafter.json last), held-out accuracy and metrics."""
    from safetensors.torch import save_file

    drafter_dir = out / "drafter"
    drafter_dir.mkdir(parents=True, exist_ok=True)
    tmp = drafter_dir / f".model.{uuid.uuid4().hex}.tmp"
    try:
        save_file(state_dict_cpu(run.model), str(tmp))
        os.replace(tmp, drafter_dir / "model.safetensors")
    finally:
        tmp.unlink(missing_ok=True)
    K = int(run.settings["ttt_steps"])
    atomic.write_json(
        out / "heldout.json", {"ttt_steps": K, "checkpoint_step": total, **(held or {})}
    )
    atomic.copy(work / "metrics.csv", out / "metrics.csv")
    tc = run.target_cfg
    text = tc.get("text_config", tc)
    target = {
        "path": str(target_dir),
        "architectures": tc.get("architectures", []),
        "num_hidden_layers": int(text["num_hidden_layers"]),
        "hidden_size": int(text["hidden_size"]),
        "vocab_size": int(text["vocab_size"]),
        "config_sha256": _sha256_file(Path(target_dir) / "config.json"),
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
            "config": run.model.config.to_dict(),
            "aux_layer_ids": run.aux_ids,
            "layer_convention": "output",
            "target": target,
            "draft_vocab": {"path": str(vocab), "sha256": _sha256_file(Path(vocab))},
            "train": {"steps": total, "identity": identity, "settings": run.settings},
            "heldout": held,
        },
    )
