"""`eyrie report`: figures and summary.md (verdict first) from whatever the run produced,
outside Snakemake (eyrie.evaluate.report).

Paths come from the config's layout under {results} (eyrie.common.layout); the step is
eyrie/evaluate/stage.py's run_report, as rule report runs it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from eyrie.common.layout import SPLITS, Layout


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="config.yaml", help="workflow config")
    parser.add_argument("--out", help="report folder (default {results}/report)")


def run(args) -> int:
    from eyrie.common.config import load
    from eyrie.evaluate.stage import run_report

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    layout = Layout.of(load(args.config))
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
