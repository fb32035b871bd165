"""`eyrie patch-server`: build the SGLang patch bundle from verify_env's report, outside Snakemake.

The bundle changes no file of SGLang: see docs/sglang-backend.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from eyrie.cli.config import load_for
from eyrie.common.layout import Layout


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="config.yaml", help="workflow config (config.yaml)")
    parser.add_argument(
        "--report", help="verify_env's JSON report (default {results}/verify/report.json)"
    )
    parser.add_argument("--out", help="bundle folder to write (default {results}/patch)")
    parser.add_argument(
        "--mechanism",
        choices=["auto", "forward_hooks", "import_hook"],
        help="override capture.sglang.mechanism",
    )
    parser.add_argument("--json", action="store_true", help="print the whole manifest")


def run(args) -> int:
    from eyrie.sglang.patch.bundle import PatchError, bundle_from_config

    cfg = load_for("patch-server", args.config)
    if cfg is None:
        return 2
    layout = Layout.of(cfg)
    report = Path(args.report or layout.verify_report())
    out = Path(args.out or layout.patch_dir())
    capture = dict(cfg["capture"])
    if args.mechanism:
        capture["sglang"] = {**(capture.get("sglang") or {}), "mechanism": args.mechanism}
    try:
        manifest = bundle_from_config(report, out, capture)
    except PatchError as exc:
        print(f"eyrie patch-server: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(manifest, indent=1))
        return 0
    print(
        f"{out}: SGLang {manifest['sglang']['version']}, {manifest['architecture']}, "
        f"verdict {manifest['verdict']}, mechanism {manifest['mechanism']}"
    )
    print(f"  why: {manifest['mechanism_why']}")
    print(
        f"  aux layers {manifest['aux_layer_ids']} (passed to SGLang as "
        f"{manifest['pass_to_sglang']}); {len(manifest['sglang']['files'])} files hashed"
    )
    return 0
