"""Snakemake adapter for rule train_drafter: eyrie.train.stage.run_train, in this process or with
train.processes > 1 one process per GPU (DDP), the rendezvous on train.rdzv_host (null:
127.0.0.1 only)."""

from pathlib import Path

from eyrie.common.adapter import rule_log
from eyrie.train.stage import run_train

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

settings = dict(sm.params.settings)
with rule_log(sm, threads=False) as log:  # run_train shares the job's threads among processes
    out = Path(sm.output.metrics).parent  # {R}/train; checkpoints in {R}/train/work (no output)
    run_train(
        train_stores=list(sm.input.train),
        heldout_stores=list(sm.input.heldout),
        target_dir=Path(sm.input.target).parent,
        vocab_path=sm.input.vocab,
        out_dir=out,
        work_dir=out / "work",
        settings=settings,
        progress=True,  # a line in the job's log every few seconds: step, loss, ETA
        processes=int(settings.get("processes", 1)),
        rdzv_host=settings.get("rdzv_host"),
        threads=sm.threads,
        output=log,
    )
