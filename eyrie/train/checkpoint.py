"""Checkpoints and the live metrics file of a run's work folder: exact resume after a kill.

A checkpoint (weights in safetensors; optimizer, scheduler, step and RNG state in a torch.save
file read back with weights_only=True) is written to a temp folder and renamed into place every
``checkpoint_every`` steps. A rerun with the same settings, data and code (the same
run_identity) continues from the newest one and truncates metrics.csv to it, so a killed run
resumed equals an unbroken one; a rerun with other settings, data or code removes the stale
checkpoints and starts again. Checkpoints exist only while a training is unfinished: the run
that writes the drafter removes them (finish_work), so a rerun of a finished training (e.g.
`snakemake -R train_drafter`) trains again from step 0 rather than reloading the last one.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import json
import logging
import os
import shutil
import uuid
from functools import cache
from pathlib import Path

import torch

from eyrie.common import atomic
from eyrie.common.provenance import file_sha256
from eyrie.train.model import DrafterConfig
from eyrie.train.settings import RUNTIME_KEYS

log = logging.getLogger(__name__)


def checkpoints(work: Path) -> list[Path]:
    found = [p for p in work.glob("ckpt-*") if p.is_dir() and (p / "meta.json").is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def save_checkpoint(work: Path, step: int, model, opt, sched, identity: str, keep: int) -> Path:
    """Weights (safetensors), optimizer/scheduler/RNG (torch.save), then rename into place.

    The files are written straight into a temp folder (torch.save records the file's name in
    its archive, so it must be state.pt), fsynced, and the folder is renamed in one step: after
    a crash a ckpt-* folder is whole (prepare_work removes a half-written .ckpt-*.tmp).
    """
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
        for name in ("model.safetensors", "state.pt", "meta.json"):
            fd = os.open(tmp / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        atomic.replace_folder(tmp, final)
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
    with atomic.atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)


def run_identity(settings: dict, cfg: DrafterConfig, stores: list[dict], vocab_path, target_dir):
    """A hash of everything that decides the numbers; checkpoints of another identity are stale."""
    kept = {k: v for k, v in settings.items() if k not in RUNTIME_KEYS}
    blob = {
        "settings": kept,
        "drafter": cfg.to_dict(),
        "stores": [{k: v for k, v in s.items() if k != "path"} for s in stores],
        "vocab_sha256": file_sha256(Path(vocab_path)),
        "target_config_sha256": file_sha256(Path(target_dir) / "config.json"),
        "code_sha256": code_digest(),
        "torch": torch.__version__,
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def trainer_modules(root: Path, entry: str = "eyrie.train.trainer") -> dict[str, Path]:
    """The eyrie modules `entry` imports, followed through their own imports (those inside
    functions too), by name: the code a training run executes, read from its import statements
    so that it follows the code as it moves (eyrie/train, what they use of eyrie/store and
    eyrie/common), without the stages training never runs (report, export, the CLI)."""
    found: dict[str, Path] = {}
    todo = [entry]
    while todo:
        name = todo.pop()
        base = root / name.replace(".", "/")
        files = (base.with_suffix(".py"), base / "__init__.py")
        path = next((p for p in files if p.is_file()), None)
        if name in found or path is None:
            continue
        found[name] = path
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("eyrie.")]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("eyrie."):
                # `from eyrie.pkg import module` names a module too
                todo += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return found


@cache
def code_digest(root: Path | None = None) -> str:
    """sha256 of the trainer's code (trainer_modules) under `root`, by default the folder of the
    eyrie package this process runs: checkpoints written by other code are stale, so a fix to
    the trainer is trained with, not resumed past."""
    if root is None:
        import eyrie

        root = Path(eyrie.__file__).resolve().parent.parent
    outer = hashlib.sha256()
    for name, path in sorted(trainer_modules(root).items()):
        outer.update(f"{name}:{file_sha256(path)}\n".encode())
    return outer.hexdigest()


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
    log.warning("%s holds checkpoints of other settings, data or code; starting again", work)
    for p in found:
        shutil.rmtree(p, ignore_errors=True)
    return None


def finish_work(work: Path) -> None:
    """Remove the checkpoints of a training whose drafter is written: they were kept to resume
    it, and a rerun must train again (a kill before this resumes from the last one, which
    writes the same drafter)."""
    for p in checkpoints(work):
        shutil.rmtree(p, ignore_errors=True)
