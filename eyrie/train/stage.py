"""The training stage's steps, as the workflow's rules and the `eyrie` subcommands run them.

- draft_vocab: the draft vocabulary (d2t, t2d) from the train stores' token counts
  (eyrie/train/vocab.py);
- run_train: the drafter trained, or resumed, in this process (eyrie/train/trainer.py), or with
  ``processes`` > 1 in one process per GPU (DDP): eyrie/train/launch.py starts them, each running
  this module's `python -m eyrie.train.stage JOB` with the same arguments as JSON.

The Snakemake adapters in scripts/ and the `eyrie draft-vocab` and `eyrie train` subcommands call
these, so a rule and a subcommand give the same files.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from eyrie.common.hf_config import text_config


def draft_vocab(*, stores, target_config, size, out) -> dict:
    """Count the stores' tokens, keep the ``size`` most frequent (at most the target's whole
    vocabulary, read from its ``target_config`` config.json) and write ``out`` with its JSON
    summary beside it; returns the summary."""
    from eyrie.train import vocab

    target = json.loads(Path(target_config).read_text())
    vocab_size = int(text_config(target)["vocab_size"])
    counts = vocab.count_tokens(list(stores), vocab_size)
    picked = vocab.build(counts, min(int(size), vocab_size))
    meta = {"stores": [str(s) for s in stores], "target_config": str(target_config)}
    return vocab.save(picked, out, meta)


def run_train(
    *,
    train_stores,
    heldout_stores,
    target_dir,
    vocab_path,
    out_dir,
    work_dir=None,
    settings: dict,
    progress: bool = True,
    processes: int = 1,
    rdzv_host: str | None = None,
    threads: int | None = None,
    output=None,
) -> dict | None:
    """Train into ``out_dir`` (checkpoints in ``work_dir``, default OUT/work); the summary of
    eyrie.train.trainer.train, or None when ``processes`` > 1 trained it.

    ``threads``: torch's CPU threads, shared out among the processes (OMP_NUM_THREADS each).
    ``output``: where the processes write (a file; None: this process's stdout and stderr).
    """
    job = {
        "train_stores": [str(s) for s in train_stores],
        "heldout_stores": [str(s) for s in heldout_stores],
        "target_dir": str(target_dir),
        "vocab_path": str(vocab_path),
        "out_dir": str(out_dir),
        "work_dir": str(work_dir or Path(out_dir) / "work"),
        "settings": dict(settings),
        "progress": progress,
    }
    if processes == 1:  # alone, or one process of a DDP launch (torchrun, eyrie.train.launch)
        import torch

        from eyrie.train.trainer import train

        if threads:
            torch.set_num_threads(max(1, int(threads)))
        summary = train(**job)
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        return summary
    from eyrie.train.launch import launch
    from eyrie.train.settings import TrainError

    Path(job["work_dir"]).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(max(1, int(threads) // processes))
    cmd = [sys.executable, "-m", "eyrie.train.stage", json.dumps(job)]
    stderr = None if output is None else subprocess.STDOUT
    code = launch(cmd, processes, host=rdzv_host, env=env, stdout=output, stderr=stderr)
    if code:
        where = getattr(output, "name", "the output above")
        raise TrainError(f"a training process exited with {code}; see {where}")
    return None


def trained(out_dir, summary: dict) -> str | None:
    """The line a finished training prints: its steps and held-out accuracy per draft step;
    None without held-out stores, and on every DDP process but the first."""
    held = summary["heldout"]
    if not held or int(os.environ.get("RANK", "0")) != 0:
        return None
    accs = ", ".join(f"{a:.3f}" for a in held["acc"])
    return f"{out_dir}: {summary['steps']} steps; held-out acc per step [{accs}]"


def main(argv: list[str] | None = None) -> int:
    """One DDP process of run_train: `python -m eyrie.train.stage JOB`, JOB its arguments as
    JSON; eyrie.train.launch has set the process's rank and the rendezvous."""
    from eyrie.common.errors import known_errors

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    (text,) = sys.argv[1:] if argv is None else argv
    job = json.loads(text)
    try:
        summary = run_train(**job)
    except known_errors() as exc:  # each names the input and the fix
        print(f"error: {exc}", file=sys.stderr)
        return 1
    line = trained(job["out_dir"], summary)
    if line:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
