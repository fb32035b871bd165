"""`eyrie export`: write the trained drafter in each engine's form, checked, outside Snakemake.

Paths default to the config's layout (eyrie.common.layout): {results}/train/drafter,
{results}/draft_vocab/ and {results}/export/ENGINE; the step is eyrie/export/stage.py's
export_checked, as rule export_drafter runs it (which also gives it the first train store, so
the layers are checked against what extraction captured).
"""

from __future__ import annotations

import json
from pathlib import Path

from eyrie.cli.config import stage_config
from eyrie.common.layout import Layout


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="config.yaml", help="workflow config")
    parser.add_argument("--drafter", help="trained drafter (default {results}/train/drafter)")
    parser.add_argument(
        "--engine",
        choices=["sglang", "vllm"],
        action="append",
        help="engine form(s) to write (default: export.engines)",
    )
    parser.add_argument("--out", help="output root (default {results}/export); ENGINE below")
    parser.add_argument("--vocab", help="draft vocabulary to check d2t against")
    parser.add_argument("--report", help="write a JSON summary of the exports here")
    parser.add_argument("--target", help="target folder (default: target.path)")
    parser.add_argument(
        "--store",
        help="a train store: check the layers against what it captured (default: the "
        "drafter's own record of them)",
    )


def run(args) -> int:
    from eyrie.common.atomic import write_json
    from eyrie.export.check import EXPORT_META
    from eyrie.export.stage import export_checked
    from eyrie.target.load import configured_dir

    cfg = stage_config(args)
    layout = Layout.of(cfg)
    vocab = Path(args.vocab or layout.vocab())
    records = {}
    for engine in args.engine or cfg["export"]["engines"]:
        out = Path(args.out) / engine if args.out else layout.export(engine)
        check = export_checked(
            drafter_dir=Path(args.drafter or layout.drafter()),
            out_dir=out,
            engine=engine,
            settings=cfg["export"],
            target_dir=args.target or configured_dir(cfg),
            vocab_path=vocab if vocab.is_file() else None,
            store=args.store,
        )
        records[engine] = json.loads((out / EXPORT_META).read_text())
        print(f"{out}: {engine} export checked; config layer ids {check['config_layer_ids']}")
    if args.report:
        write_json(args.report, {"ok": True, "exports": records})
    return 0
