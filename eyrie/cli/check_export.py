"""`eyrie check-export FOLDER --engine E`: refuse a drafter folder an engine would misread.

What the folder must serve comes from eyrie/export/stage.py's folder_expectation (its
eyrie-export.json, or the target and trained layers given here); eyrie/export/check.py checks it.
Exit code 0 when the folder is fine, 1 when refused, 2 when what it must serve is unknown.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("folder", help="an exported drafter folder")
    parser.add_argument("--engine", choices=["sglang", "vllm"], required=True)
    parser.add_argument("--target", help="target folder (default: from eyrie-export.json)")
    parser.add_argument(
        "--aux-layer-ids",
        type=int,
        nargs="+",
        help="trained aux ids, output of layer i (default: eyrie-export.json)",
    )
    parser.add_argument(
        "--sglang-rule",
        choices=["plus_one", "as_is", "plus_one_if_first_is_1"],
        help="SGLang's layer-id rule (default: eyrie-export.json's, else plus_one)",
    )
    parser.add_argument("--drafter", help="trained drafter folder to compare weights with")


def run(args) -> int:
    from eyrie.export.check import EXPORT_META, check_export
    from eyrie.export.stage import folder_expectation

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    folder = Path(args.folder)
    expect = folder_expectation(
        folder,
        args.engine,
        target=args.target,
        aux_layer_ids=args.aux_layer_ids,
        sglang_rule=args.sglang_rule,
        drafter=args.drafter,
    )
    if expect is None:
        print(
            f"eyrie check-export: {folder} has no {EXPORT_META}; pass --target and "
            "--aux-layer-ids (the trained layers, output of layer i)",
            file=sys.stderr,
        )
        return 2
    problems = check_export(folder, expect)
    if problems:
        print(f"{folder}: REFUSED for {args.engine}", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    how = f", SGLang rule {expect.sglang_rule}" if args.engine == "sglang" else ""
    print(f"{folder}: ok for {args.engine} (serves layers {sorted(expect.aux_layer_ids)}{how})")
    return 0
