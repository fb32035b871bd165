"""`eyrie verify`: check statically that aux-hidden-state capture reaches the target's layers."""

from __future__ import annotations

import sys

from eyrie.verify.report import render
from eyrie.verify.source import VerifyError
from eyrie.verify.stage import run_stage, write_report


def _ids(text: str) -> list[int]:
    try:
        return [int(p) for p in text.replace(" ", "").split(",") if p]
    except ValueError:
        raise SystemExit(
            f"eyrie verify: --aux-ids takes integers like 1,15,28, not {text!r}"
        ) from None


def add_arguments(parser) -> None:
    parser.add_argument(
        "target",
        nargs="?",
        help="the target's model folder or its config.json (architectures, layer count)",
    )
    parser.add_argument("--arch", help="architecture class name, instead of config.json's")
    parser.add_argument(
        "--sglang",
        default="installed",
        help="source to inspect: 'installed' (default), a folder holding the sglang package, "
        "or pip:VERSION (wheel fetched from PyPI into $EYRIE_CACHE or ~/.cache/eyrie)",
    )
    parser.add_argument(
        "--backend",
        choices=["sglang", "hf"],
        default="sglang",
        help="sglang: read SGLang's source (default); hf: build the transformers module tree",
    )
    parser.add_argument("--aux-ids", type=_ids, help="aux layer ids, e.g. 1,15,28")
    parser.add_argument("--all", action="store_true", help="classify every EntryClass")
    parser.add_argument("--strict", action="store_true", help="fail on 'patchable' too")
    parser.add_argument("--json", dest="json_path", help="write the JSON report here")
    parser.add_argument("--md", dest="md_path", help="write the Markdown report here")


def run(args) -> int:
    if not (args.target or args.arch or args.all):
        print("eyrie verify: give a target folder, --arch NAME, or --all", file=sys.stderr)
        return 2
    if args.all and args.backend == "hf":
        print(
            "eyrie verify: --all classifies SGLang's registry; drop --backend hf", file=sys.stderr
        )
        return 2
    try:
        report = run_stage(
            args.target,
            backend=args.backend,
            aux_ids=args.aux_ids,
            sglang=args.sglang,
            strict=args.strict,
            architecture=args.arch,
            all_entries=args.all,
        )
    except VerifyError as exc:
        print(f"eyrie verify: {exc}", file=sys.stderr)
        return 2
    if args.all and not (args.target or args.arch):
        report["failures"], report["ok"] = [], True  # a survey, not a gate
    print(render(report))
    write_report(report, args.json_path, args.md_path)
    return 0 if report["ok"] else 1
