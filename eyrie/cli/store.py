"""`eyrie compare-stores`: compare two extractions of the same samples (eyrie.store.compare).

Exit code 0 when every layer passes, 1 when one fails, 2 when a store cannot be read.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--a", nargs="+", required=True, help="shard stores of one extraction")
    p.add_argument("--b", nargs="+", required=True, help="shard stores of the other")
    p.add_argument("--min-cosine", type=float, default=0.999)
    p.add_argument("--json", dest="json_path", help="write the report here")


def run(args) -> int:
    from eyrie.common.atomic import write_json
    from eyrie.store.compare import compare, render
    from eyrie.store.shard import StoreError

    try:
        report = compare(args.a, args.b, min_cosine=args.min_cosine)
    except (StoreError, ValueError) as exc:
        print(f"eyrie compare-stores: {exc}", file=sys.stderr)
        return 2
    print(render(report))
    if args.json_path:
        write_json(args.json_path, report)
    return 0 if report["ok"] else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m eyrie.cli.store", description=__doc__)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
