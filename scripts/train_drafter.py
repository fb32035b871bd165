"""Snakemake adapter for rule train_drafter: eyrie.train.trainer in this process, or with
train.processes > 1 one process per GPU (DDP), started by eyrie.train.launch with the rendezvous
on train.rdzv_host (null: 127.0.0.1 only)."""

import os
import subprocess
import sys
from pathlib import Path

import yaml

from eyrie.common.adapter import rule_log

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

settings = dict(sm.params.settings)
out = Path(sm.output.metrics).parent  # {R}/train; checkpoints in {R}/train/work (no output)
work = out / "work"
target = str(Path(sm.input.target).parent)
processes = int(settings.get("processes", 1))
with rule_log(sm, threads=processes == 1) as log:  # DDP: each process sets its own threads
    if processes == 1:
        from eyrie.train.trainer import train

        train(
            train_stores=list(sm.input.train),
            heldout_stores=list(sm.input.heldout),
            target_dir=target,
            vocab_path=sm.input.vocab,
            out_dir=out,
            work_dir=work,
            settings=settings,
            progress=True,  # a line in the job's log every few seconds: step, loss, ETA
        )
    else:  # the same run, through the CLI, one process each (eyrie/train/launch.py)
        from eyrie.train.launch import launch

        work.mkdir(parents=True, exist_ok=True)
        cfg_path = work / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(dict(sm.config)))
        cmd = [
            sys.executable,
            "-m",
            "eyrie.cli.main",
            "train",
            "--config",
            str(cfg_path),
            "--train-stores",
            *sm.input.train,
            "--heldout-stores",
            *sm.input.heldout,
            "--target",
            target,
            "--vocab",
            sm.input.vocab,
            "--out",
            str(out),
            "--work",
            str(work),
        ]
        threads = max(1, sm.threads // processes)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        host = settings.get("rdzv_host")
        code = launch(cmd, processes, host=host, env=env, stdout=log, stderr=subprocess.STDOUT)
        if code:
            raise SystemExit(f"error: a training process exited with {code}; see {sm.log[0]}")
