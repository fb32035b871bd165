"""Snakemake adapter for rule report: figures and summary.md (verdict first) from the run."""

import contextlib
from pathlib import Path

from eyrie.cli.evaluate import run_report

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with open(sm.log[0], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    written = run_report(
        out_dir=Path(sm.output.summary).parent,
        acceptance=sm.input.acceptance,
        speculate=sm.input.speculate,
        online=sm.input.online,
        train_metrics=sm.input.train_metrics,
        validate=sm.input.validate,
        baselines=sm.input.baselines,
        figures={name: Path(getattr(sm.output, name)) for name in sm.params.figures},
    )
    print(Path(written["summary"]).read_text())
