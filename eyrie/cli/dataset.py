"""`eyrie dataset PATH`: report every record of a chat file (JSON Lines, or one JSON array) that
is not a sample."""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    from eyrie.data.dataset import FORMATS, LEADING_ASSISTANT, POLICIES

    parser.add_argument(
        "path",
        help="chat JSONL or one JSON array (OpenAI messages, ShareGPT conversations, MT-bench "
        "turns)",
    )
    parser.add_argument(
        "--format", default="auto", choices=FORMATS, help="record form; auto decides per record"
    )
    parser.add_argument(
        "--regenerate",
        action="store_true",
        help="as with regenerate.enabled: true: a conversation without an assistant turn is a "
        "prompt the target will answer, not a bad line",
    )
    parser.add_argument(
        "--leading-assistant",
        default="drop",
        choices=LEADING_ASSISTANT,
        help="as dataset.leading_assistant: drop an assistant turn before the first user turn, "
        "or count the conversation as a bad line (assistant_first)",
    )
    parser.add_argument(
        "--on-bad-input",
        default="skip",
        choices=POLICIES,
        help="skip: list every problem; fail: stop at the first one (exit 1)",
    )
    parser.add_argument(
        "--target",
        help="a model folder: also tokenize each conversation with its chat template, as "
        "extraction will, and list the prompts longer than --max-tokens",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=2048, help="dataset.max_tokens (with --target)"
    )


def run(args) -> int:
    return check_dataset(args)


def check_dataset(args) -> int:
    """Lists every problem even under `fail`, so one run shows all that needs fixing. A file
    with no usable conversation is an error (exit 1): a run would stop on it."""
    from eyrie.data.dataset import (
        DatasetError,
        dropped_count,
        dropped_text,
        fitting,
        nothing_usable,
        read_chat,
        summary,
    )

    try:
        convs, problems = read_chat(
            args.path, args.format, "skip", None, args.regenerate, args.leading_assistant
        )
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.target:
        from eyrie.target.load import load_tokenizer

        if args.max_tokens < 1:
            print(f"error: --max-tokens must be at least 1, not {args.max_tokens}", file=sys.stderr)
            return 2
        tokenizer = load_tokenizer(args.target)  # a TargetError names the folder and the fix
        convs, unfit = fitting(
            convs, args.path, tokenizer, args.max_tokens, answers_later=args.regenerate
        )
        problems = sorted(problems + unfit, key=lambda p: p.record)
    for problem in problems:
        print(problem.describe())
    print(summary(args.path, convs, problems) + dropped_text(dropped_count(convs)), flush=True)
    if not convs:
        print(f"error: {nothing_usable(args.path, None, problems)}", file=sys.stderr)
        return 1
    bad = sum(p.is_bad for p in problems)
    if bad and args.on_bad_input == "fail":
        print(f"error: {bad} bad line(s) in {args.path}, listed above", file=sys.stderr)
        return 1
    return 0
