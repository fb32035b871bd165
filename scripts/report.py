"""Snakemake adapter for rule report: figures, summary.md (verdict first) and the HTML report's
landing page from the run."""

from pathlib import Path

from eyrie.common.adapter import rule_log
from eyrie.evaluate.stage import run_report

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm, threads=False):
    written = run_report(
        out_dir=Path(sm.output.summary).parent,
        acceptance=sm.input.acceptance,
        speculate=sm.input.speculate,
        online=sm.input.online,
        train_metrics=sm.input.train_metrics,
        validate=sm.input.validate,
        baselines=sm.input.baselines,
        problems=list(sm.input.problems),
        figures={name: Path(getattr(sm.output, name)) for name in sm.params.figures},
    )
    print(Path(written["summary"]).read_text())
