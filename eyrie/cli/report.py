"""`eyrie report`: figures and summary.md (verdict first) from whatever the run produced,
outside Snakemake (eyrie.evaluate.report).

Paths come from the config's layout under {results} (eyrie.common.layout); the step is
eyrie/evaluate/stage.py's run_report, as rule report runs it.
"""

from __future__ import annotations

from pathlib import Path

from eyrie.cli.config import stage_config
from eyrie.common.layout import SPLITS, Layout


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="config.yaml", help="workflow config")
    parser.add_argument("--out", help="report folder (default {results}/report)")


def run(args) -> int:
    from eyrie.evaluate.stage import run_report

    layout = Layout.of(stage_config(args))
    ev = layout.evaluate_dir()
    written = run_report(
        out_dir=args.out or layout.report_dir(),
        acceptance=ev / "acceptance.json",
        speculate=ev / "speculate.json",
        online=ev / "online_sglang.json",
        train_metrics=layout.train_dir() / "metrics.csv",
        validate=layout.validate_dir() / "summary.csv",
        baselines=ev / "baselines.json",
        problems=[layout.problems(split) for split in SPLITS],
    )
    print(Path(written["summary"]).read_text().splitlines()[0])
    print(f"written: {', '.join(str(p) for p in written.values())}")
    return 0
