"""`eyrie make-dataset`: build data/chat (train, heldout, datasheet) from the standard library's
docs (eyrie.data.shipped)."""

from __future__ import annotations

import platform


def add_arguments(parser) -> None:
    from eyrie.data.chat_corpus import SEED

    parser.add_argument("--out", default="data/chat", help="folder for train/heldout JSONL")
    parser.add_argument("--seed", type=int, default=SEED, help="seed for phrasing and order")


def run(args) -> int:
    from eyrie.data.shipped import write

    counts = write(args.out, args.seed)
    summary = ", ".join(f"{k}: {v}" for k, v in counts.items())
    print(f"wrote {args.out}: {summary} conversations (Python {platform.python_version()})")
    return 0
