"""`eyrie validate`: check shard stores against their input and the target, outside Snakemake.

With --split and --shard one shard is checked and its report written; without them every shard
of the config is checked and the summary written, failing past validate.max_errors.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from eyrie.cli.config import load_for
from eyrie.common.layout import Layout, shard_name

if TYPE_CHECKING:
    from eyrie.validate.settings import ValidateSettings

SPLITS = ("train", "heldout")


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="config.yaml", help="workflow config (config.yaml)")
    parser.add_argument("--split", choices=SPLITS, help="one split (with --shard)")
    parser.add_argument("--shard", type=int, help="one shard, 0-based (with --split)")


def validate_one(
    cfg: dict, settings: ValidateSettings, split: str, shard: int
) -> tuple[Path, dict]:
    from eyrie.common.atomic import write_json
    from eyrie.target.load import configured_dir
    from eyrie.validate.shard import validate_shard

    layout = Layout.of(cfg)
    report = validate_shard(
        store=layout.store(split, shard),
        errors_csv=layout.errors(split, shard),
        data_path=layout.conversations(cfg, split),
        target_path=configured_dir(cfg),
        architecture=cfg["target"].get("architecture"),
        split=split,
        shard=shard,
        shards=cfg["extract"]["shards"],
        max_tokens=cfg["dataset"]["max_tokens"],
        aux_layer_ids=cfg["capture"]["aux_layer_ids"],
        device=cfg["capture"]["device"],
        settings=settings,
    )
    out = layout.validate_dir() / split / f"{shard_name(shard)}.json"
    write_json(out, report, default=str)
    print(f"{out}: {report['errors']} errors {report['error_counts']}")
    return out, report


def run(args) -> int:
    from eyrie.validate.settings import validate_settings
    from eyrie.validate.summary import summarize

    cfg = load_for("validate", args.config)
    if cfg is None:
        return 2
    if (args.split is None) != (args.shard is None):
        print("eyrie validate: give both --split and --shard, or neither", file=sys.stderr)
        return 2
    settings = validate_settings(cfg["validate"])
    if args.split is not None:
        from eyrie.common.rerun import Rerun
        from eyrie.validate.advice import over_limit

        _, report = validate_one(cfg, settings, args.split, args.shard)
        message = over_limit(report, settings.max_errors, Rerun.of_config(args.config))
        if message:
            print(f"eyrie validate: {message}", file=sys.stderr)
            return 1
        return 0
    reports = [
        validate_one(cfg, settings, split, shard)[0]
        for split in SPLITS
        for shard in range(cfg["extract"]["shards"])
    ]
    out = Layout.of(cfg).validate_dir()
    from eyrie.common.rerun import Rerun

    ok, message = summarize(
        reports,
        out / "summary.csv",
        out / "summary.md",
        settings.max_errors,
        rerun=Rerun.of_config(args.config),
        allow_overlap=cfg["dataset"]["allow_overlap"],  # the config is loaded with defaults
    )
    print(message, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1
