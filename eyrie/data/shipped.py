"""The shipped chat dataset on disk: train.jsonl, heldout.jsonl and the datasheet README.md.

The files are what `eyrie make-dataset` writes and data/chat holds; the datasheet records the
Python that built them, the license of the text and the counts, so a rebuild can be checked byte
for byte against the shipped copy.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

from eyrie.common.atomic import write_text
from eyrie.data.chat_corpus import (
    HELDOUT_PERCENT,
    MAX_ANSWER_CHARS,
    MAX_MODULE_CHARS,
    SEED,
    build,
    split_of,
)
from eyrie.data.stdlib_docs import MIN_DOC_CHARS

MAX_TOTAL_BYTES = 12_000_000


def _stats(convs: list[dict]) -> dict:
    turns = [len(c["messages"]) for c in convs]
    chars = [sum(len(m["content"]) for m in c["messages"]) for c in convs]
    return {
        "conversations": len(convs),
        "messages": sum(turns),
        "with_system": sum(c["messages"][0]["role"] == "system" for c in convs),
        "multi_turn": sum(sum(m["role"] == "assistant" for m in c["messages"]) > 1 for c in convs),
        "characters": sum(chars),
        "mean_characters": round(sum(chars) / max(len(chars), 1)),
        "max_characters": max(chars, default=0),
    }


def _kind_counts(convs: list[dict]) -> dict:
    counts: dict[str, int] = {}
    for c in convs:
        kind = c["id"].split("-")[1]
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))


def datasheet(splits: dict[str, list[dict]], seed: int) -> str:
    stats = {name: _stats(convs) for name, convs in splits.items()}
    rows = "\n".join(
        f"| {name} | {s['conversations']} | {s['messages']} | {s['multi_turn']} | "
        f"{s['with_system']} | {s['characters']} | {s['mean_characters']} | {s['max_characters']} |"
        for name, s in stats.items()
    )
    kinds = _kind_counts([c for convs in splits.values() for c in convs])
    kind_rows = "\n".join(f"| {k} | {n} |" for k, n in kinds.items())
    return f"""# Eyrie's default chat dataset

Chat conversations in OpenAI `messages` form, one JSON object per line:
`{{"id": "...", "messages": [{{"role": "system"|"user"|"assistant", "content": "..."}}, ...]}}`.
They feed the default workflow (`config.yaml` → `dataset.train`, `dataset.heldout`) and the
shipped toy target's tokenizer.

## Source and license

Every answer is text from the Python standard library's own documentation, as installed with
Python {platform.python_version()}: the docstrings of public stdlib modules, classes, functions and
methods (with `inspect.signature` where available), and the language reference topics in
`pydoc_data.topics`. That documentation is distributed under the
[Python Software Foundation License](https://docs.python.org/3/license.html), which permits
redistribution with its notice: Copyright © 2001 Python Software Foundation; All Rights Reserved.
The full license text ships with every Python installation (`LICENSE.txt`).
The questions, follow-ups and system lines are short templates in `eyrie/data/chat_corpus.py`.

Skipped: tests, GUI toolkits (`tkinter`, `turtle`, `idlelib`), deprecated packages, private
names, per-codec modules, modules that act when imported, and modules that fail to import.
Docstrings shorter than {MIN_DOC_CHARS} characters are skipped; answers are cut at a paragraph
boundary to at most {MAX_ANSWER_CHARS} characters (module overviews {MAX_MODULE_CHARS}).
Each object and each docstring is used once (a re-export or a copied docstring is documented
under its first name in sorted module order), and conversations with identical answers are
kept once.

## Build

- Python: {platform.python_version()} ({platform.python_implementation()}, {sys.platform})
- Seed: {seed}
- Split: by the id's SHA-256 (first 8 hex digits mod 100 < {HELDOUT_PERCENT} → held out), so
  a conversation keeps its split when the corpus grows.
- Order: a seeded shuffle, so the first N lines (`dataset.max_samples`) are a mixed sample.

Rebuild (the result depends only on the Python version and platform, not on the folder, the
user or whether Python runs in a virtualenv):

```
eyrie make-dataset --out data/chat
```

## Contents

| split | conversations | messages | multi-turn | system | characters | mean chars | max chars |
|---|---|---|---|---|---|---|---|
{rows}

| kind (id `pydoc-<kind>-<name>`) | conversations |
|---|---|
{kind_rows}

Multi-turn: module overviews with one or two follow-ups, and topics continued over up to three
answers.
"""


def write(out_dir: str | Path, seed: int = SEED) -> dict[str, int]:
    """Build and write train.jsonl, heldout.jsonl and README.md; returns counts per split."""
    out_dir = Path(out_dir)
    convs = build(seed)
    splits: dict[str, list[dict]] = {"train": [], "heldout": []}
    for conv in convs:
        splits[split_of(conv["id"])].append(conv)
    texts = {
        name: "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in items)
        for name, items in splits.items()
    }
    total = sum(len(t.encode()) for t in texts.values())
    if total > MAX_TOTAL_BYTES:
        raise RuntimeError(
            f"dataset is {total} bytes, over the {MAX_TOTAL_BYTES} byte budget; lower "
            "MAX_ANSWER_CHARS in eyrie/data/chat_corpus.py or skip more modules in "
            "eyrie/data/stdlib_docs.py"
        )
    for name, text in texts.items():
        write_text(out_dir / f"{name}.jsonl", text)
    write_text(out_dir / "README.md", datasheet(splits, seed))
    return {name: len(items) for name, items in splits.items()}
