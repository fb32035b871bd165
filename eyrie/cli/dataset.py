"""`eyrie dataset PATH`: read a chat JSONL file and report every line that is not a sample."""

from __future__ import annotations

import sys

from eyrie.data.dataset import FORMATS, POLICIES, DatasetError, read_chat, summary


def add_arguments(parser) -> None:
    parser.add_argument("path", help="chat JSONL (OpenAI messages or ShareGPT conversations)")
    parser.add_argument(
        "--format", default="auto", choices=FORMATS, help="line form; auto decides per line"
    )
    parser.add_argument(
        "--on-bad-input",
        default="skip",
        choices=POLICIES,
        help="skip: list every problem; fail: stop at the first one (exit 1)",
    )


def run(args) -> int:
    """Lists every problem even under `fail`, so one run shows all that needs fixing."""
    try:
        convs, problems = read_chat(args.path, fmt=args.format, on_bad="skip", key=None)
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for problem in problems:
        print(problem.describe())
    print(summary(args.path, convs, problems), flush=True)
    bad = sum(p.is_bad for p in problems)
    if bad and args.on_bad_input == "fail":
        print(f"error: {bad} bad line(s) in {args.path}, listed above", file=sys.stderr)
        return 1
    return 0
