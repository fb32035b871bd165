"""`eyrie regenerate`: the target answers one split's prompts itself, outside Snakemake.

Reads {results}/data/SPLIT.jsonl (rule prepare_dataset's output) and writes
{results}/regen/SPLIT.jsonl and its summary, with the config's `regenerate` settings (whether
or not regenerate.enabled is set: running the subcommand is the request).
"""

from __future__ import annotations

from eyrie.common.config import load
from eyrie.common.layout import SPLITS, Layout


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="config.yaml", help="workflow config (config.yaml)")
    parser.add_argument("--split", required=True, choices=SPLITS)
    parser.add_argument("--data", help="prepared split (default {results}/data/SPLIT.jsonl)")
    parser.add_argument("--out", help="output JSONL (default {results}/regen/SPLIT.jsonl)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    from eyrie.regenerate.stage import SplitJob, regenerate_split
    from eyrie.target.load import configured_dir

    cfg = load(args.config)  # a ConfigError names every bad key; eyrie.cli.main prints it
    layout = Layout.of(cfg)
    out = args.out or layout.regenerated(args.split)
    settings = {k: v for k, v in cfg["regenerate"].items() if k != "enabled"}
    job = SplitJob(
        data=args.data or layout.dataset(args.split),
        target=configured_dir(cfg),
        out=out,
        split=args.split,
        architecture=cfg["target"].get("architecture"),
    )
    summary = regenerate_split(job, settings, progress=not args.no_progress)
    c = summary["counts"]
    print(
        f"{out}: {c['generated']} regenerated, {c['skipped']} skipped, {c['failed']} failed of "
        f"{c['input']} ({summary['seconds']} s); answers by kind {c['kinds']}"
    )
    return 0
