"""Read a chat dataset and account for every record: JSON Lines (one conversation a line), or
one JSON array of conversations (ShareGPT's file), read as a stream.

Each record is checked and normalized by eyrie/data/records.py (OpenAI `messages`, ShareGPT
`conversations`, MT-bench `turns`). Bad input is never dropped silently: each record that cannot
become a conversation is a `Problem` with where it is, a short `kind` and a reason that says how
to fix it. Under the `skip` policy problems are counted and returned; under `fail` the first one
raises `DatasetError`.

Where a record is (the problems table's columns, docs/datasets.md): `line`, the line it starts
on (a JSONL line's number); `record`, its number in the file (1-based: a JSONL line's number, a
JSON array element's position); `offset`, the byte offset of its first byte.

A file is a JSON array when its first character is `[` (a `.jsonl` file is always JSON Lines).
The array is read element by element (eyrie/data/json_stream.py): memory stays flat, and a
caller that stops (prepare's max_samples) stops reading the file there.

Problem kinds: not_utf8, malformed_json, lone_surrogate, not_an_object, bad_id, no_messages,
unknown_role, bad_content, no_assistant_turn, duplicate_id, truncated_file (an array cut off:
one problem, at the byte where the lost element starts); with the target's tokenizer
(`fitting`) also prompt_too_long and the chat template's refusals (template_error,
assistant_first, not_prefix_stable). A conversation without an assistant turn is a prompt, kept,
when regeneration will answer it (`prompts_ok`), and bad input (no_assistant_turn) otherwise.
A blank line holds no sample, so it is reported as kind `blank_line`, a notice: it is listed and
counted, but is never "bad" and never fails a run (a file that ends with an extra newline is
not an error; a file that is mostly blank lines still shows up in the counts).
"""

from __future__ import annotations

import json
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from eyrie.common.atomic import atomic_path, write_text
from eyrie.common.errors import EyrieError
from eyrie.data.chat_tokens import unusable
from eyrie.data.json_stream import ArrayReader, starts_array
from eyrie.data.records import DROPPED_TURNS, FORMATS, Bad, decode_line, parse_record

POLICIES = ("skip", "fail")
LEADING_ASSISTANT = ("drop", "bad")
NOTICE_KINDS = frozenset({"blank_line"})
PROBLEM_COLUMNS = ["path", "line", "record", "offset", "kind", "reason", "sample_id"]
SKIP_HINT = "set dataset.on_bad_input: skip to count and skip such lines"


class DatasetError(EyrieError, ValueError):
    """A dataset that cannot be read; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class Conversation:
    id: str
    messages: list[dict]  # [{"role": "system"|"user"|"assistant", "content": str}, ...]
    line: int  # the line it starts on
    element: int | None = None  # its position in a JSON array (1-based); None: a JSONL line
    offset: int = 0  # byte offset of its first byte
    extra: dict = field(default_factory=dict)  # fields kept from the record (MT-bench category)

    def source(self, path) -> str:
        """Where it is in the file read: FILE:LINE, and its element number in an array."""
        at = f"{path}:{self.line}"
        return at if self.element is None else f"{at} (element {self.element})"


@dataclass(frozen=True)
class Problem:
    path: str
    line: int  # the line the record starts on
    kind: str
    reason: str
    sample_id: str | None = None
    element: int | None = None  # its position in a JSON array (1-based); None: a JSONL line
    offset: int | None = None  # byte offset of the record's first byte

    @property
    def record(self) -> int:
        """The record's number in the file: a JSON array element's position, a JSONL line's."""
        return self.line if self.element is None else self.element

    @property
    def is_bad(self) -> bool:
        """False for notices (blank lines), which never fail a run."""
        return self.kind not in NOTICE_KINDS

    def describe(self) -> str:
        sid = f" (id {self.sample_id})" if self.sample_id else ""
        where = f"{self.path}:{self.line}"
        if self.element is not None:
            where += f" (element {self.element}, byte {self.offset})"
        return f"{where}: {self.kind}{sid}: {self.reason}"


# ---------------------------------------------------------------- a file


def stops(problem: Problem) -> DatasetError:
    """The error that stops a run on `problem` under dataset.on_bad_input: fail."""
    return DatasetError(f"{problem.describe()}\nFix the line, or {SKIP_HINT}.")


def _check_choice(value: str, allowed: tuple[str, ...], key: str) -> None:
    if value not in allowed:
        raise DatasetError(f"{key} is {value!r}; use one of {list(allowed)}")


def is_array(path: str | Path) -> bool:
    """Whether `path` is read as one JSON array: its first character is `[` and it is not named
    .jsonl (a JSON Lines file whose first line is an array is a bad line, not an array)."""
    return Path(path).suffix.lower() != ".jsonl" and starts_array(path)


def _jsonl(path: Path):
    """(line, None, byte offset, value or Bad) of every line."""
    with open(path, "rb") as fh:
        end = 0
        for lineno, raw in enumerate(fh, start=1):
            start, end = end, end + len(raw)
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte order mark, as some editors write
            raw = raw.rstrip(b"\r\n")
            if not raw.strip():
                yield lineno, None, start, Bad("blank_line", "blank line (harmless)")
                continue
            try:
                yield lineno, None, start, decode_line(raw)
            except Bad as bad:
                yield lineno, None, start, bad


def _array(path: Path):
    """(line, element, byte offset, value or Bad) of every element of a JSON array."""
    with open(path, "rb") as fh:
        for item in ArrayReader(fh):
            value = Bad(item.kind, item.reason) if item.kind else item.value
            yield item.line, item.number, item.offset, value


def iter_chat(
    path: str | Path,
    fmt: str = "auto",
    on_bad: str = "skip",
    key: str | None = "dataset.train / dataset.heldout",
    prompts_ok: bool = False,
    leading_assistant: str = "drop",
):
    """A Conversation or a Problem for every record of a chat file, in file order, as an
    iterator: a caller that stops taking records stops the reading (close it, or let it go).
    The options and the file's existence are checked at once.

    `fmt` "auto" decides per record (messages, then conversations, then turns). `key` is the
    config key that names this file, quoted when it is missing (None: the path is not from a
    config). Under `on_bad="fail"` the first bad record raises DatasetError; notices (blank
    lines) never do. `prompts_ok` (regenerate.enabled) keeps a conversation without an
    assistant turn: the target will answer its user turns. `leading_assistant`
    (dataset.leading_assistant) "drop" removes assistant turns before the first user turn
    (eyrie/data/records.py, drop_leading_assistant); "bad" leaves them to be refused.
    """
    _check_choice(fmt, FORMATS, "dataset.format")
    _check_choice(on_bad, POLICIES, "dataset.on_bad_input")
    _check_choice(leading_assistant, LEADING_ASSISTANT, "dataset.leading_assistant")
    path = Path(path)
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        fix = f"set {key} in the config to a chat file" if key else "check the path"
        raise DatasetError(f"dataset file {path} {what}; {fix}")
    return _records(path, fmt, on_bad, prompts_ok, leading_assistant)  # read as it is taken


def _records(path: Path, fmt: str, on_bad: str, prompts_ok: bool, leading_assistant: str):
    stem, shown = path.stem, str(path)
    first: dict[str, str] = {}  # id -> where it was first used
    for line, element, offset, value in (_array if is_array(path) else _jsonl)(path):
        number = line if element is None else element
        try:
            if isinstance(value, Bad):
                raise value
            sid, messages, extra = parse_record(
                value, fmt, stem, number, prompts_ok, leading_assistant
            )
            if sid in first:
                raise Bad("duplicate_id", f"id already used {first[sid]}; ids must be unique", sid)
        except Bad as bad:
            problem = Problem(shown, line, bad.kind, bad.reason, bad.sample_id, element, offset)
            if on_bad == "fail" and problem.is_bad:
                raise stops(problem) from None
            yield problem
            continue
        first[sid] = f"on line {line}" if element is None else f"by element {element}"
        yield Conversation(sid, messages, line, element, offset, extra)


def read_chat(
    path: str | Path,
    fmt: str = "auto",
    on_bad: str = "skip",
    key: str | None = "dataset.train / dataset.heldout",
    prompts_ok: bool = False,
    leading_assistant: str = "drop",
) -> tuple[list[Conversation], list[Problem]]:
    """Every good conversation of a chat file, and a Problem for every other record
    (`iter_chat` says how)."""
    convs: list[Conversation] = []
    problems: list[Problem] = []
    for item in iter_chat(path, fmt, on_bad, key, prompts_ok, leading_assistant):
        (convs if isinstance(item, Conversation) else problems).append(item)
    return convs, problems


def dropped_count(convs: list[Conversation]) -> int:
    """How many of the conversations lost assistant turns before their first user turn."""
    return sum(DROPPED_TURNS in c.extra for c in convs)


def dropped_text(n: int) -> str:
    """The summary line's tail for `n` such conversations ("" for none)."""
    return f"; {n} opened with an assistant turn, dropped" if n else ""


def count_kinds(problems: list[Problem]) -> dict[str, int]:
    return dict(sorted(Counter(p.kind for p in problems).items()))


def summary(path: str | Path, good: list[Conversation] | int, problems: list[Problem]) -> str:
    """One line: good conversations (a list, or their number), bad lines by kind, blank lines."""
    bad = [p for p in problems if p.is_bad]
    text = f"{path}: {good if isinstance(good, int) else len(good)} good, {len(bad)} bad"
    if bad:
        text += " (" + ", ".join(f"{k}: {n}" for k, n in count_kinds(bad).items()) + ")"
    if len(problems) > len(bad):
        text += f", {len(problems) - len(bad)} blank lines"
    return text


# ---------------------------------------------------------------- the target's template


def unfit(conv: Conversation, path, tokenizer, max_tokens: int, answers_later: bool = False):
    """A Problem when extraction could not use the conversation, else None: tokenized with the
    target's chat template as extraction does, answers past `max_tokens` are cut and kept, but
    a prompt that alone fills `max_tokens` leaves no answer token, and a conversation the
    template refuses has no tokens at all. `answers_later` (regenerate.enabled): checked with a
    stand-in answer wherever the target will answer (eyrie/data/chat_tokens.py)."""
    verdict = unusable(tokenizer, conv.messages, max_tokens, answers_later)
    if verdict is None:
        return None
    return Problem(str(path), conv.line, *verdict, conv.id, conv.element, conv.offset)


def fitting(
    convs: list[Conversation],
    path: str | Path,
    tokenizer,
    max_tokens: int,
    *,
    on_bad: str = "skip",
    answers_later: bool = False,
) -> tuple[list[Conversation], list[Problem]]:
    """The conversations extraction can use, and a Problem for each other one (`unfit`).
    Checked when the dataset is prepared, not after the whole extraction. Under on_bad "fail"
    the first such problem raises DatasetError."""
    kept: list[Conversation] = []
    problems: list[Problem] = []
    for conv in convs:
        problem = unfit(conv, path, tokenizer, max_tokens, answers_later)
        if problem is None:
            kept.append(conv)
            continue
        if on_bad == "fail":
            raise stops(problem)
        problems.append(problem)
    return kept, problems


# ---------------------------------------------------------------- writing


def problems_frame(problems: list[Problem]) -> pd.DataFrame:
    rows = [
        [p.path, p.line, p.record, p.offset, p.kind, p.reason, p.sample_id] for p in problems
    ]
    frame = pd.DataFrame(rows, columns=PROBLEM_COLUMNS)
    return frame.astype({"line": "int64", "record": "int64", "offset": "Int64"})


def write_problems(problems: list[Problem], path: str | Path) -> None:
    """The problems table as CSV (header even when empty), written atomically."""
    write_text(path, problems_frame(problems).to_csv(index=False))


def message_row(c: Conversation, source=None) -> str:
    """A conversation as a messages JSONL line; with `source` (the file read), the line also
    names where it is there as "source": "FILE:LINE" (and its element of a JSON array), which
    later stages quote instead of this file's line numbers. Fields kept from a record (an
    MT-bench category) go beside the messages."""
    out = {"id": c.id, "messages": c.messages, **c.extra}
    if source is not None:
        out["source"] = c.source(source)
    return json.dumps(out, ensure_ascii=False) + "\n"


def prepare(
    src: str | Path,
    dst_jsonl: str | Path,
    problems_csv: str | Path,
    fmt: str = "auto",
    on_bad: str = "skip",
    max_samples: int | None = None,
    split: str | None = None,
    target: str | Path | None = None,
    max_tokens: int | None = None,
    kept_problems_csv: str | Path | None = None,
    regenerate: bool = False,
    leading_assistant: str = "drop",
) -> dict:
    """Normalize a chat file for one split: the first `max_samples` good conversations (file
    order) as messages JSONL, and every problem met as CSV. Returns the counts it prints.

    The file is read record by record and each conversation written as it comes (memory stays
    flat), and reading stops at the conversation that completes `max_samples`: what follows it
    is neither read nor checked. With `target` (a model folder) each conversation is also
    tokenized with its chat template as extraction will (`unfit`): one whose prompt alone fills
    `max_tokens`, or that the template cannot render, is a bad line. `regenerate`
    (regenerate.enabled) keeps conversations without an assistant turn (prompts the target
    will answer). `leading_assistant` (dataset.leading_assistant) as `iter_chat` says; the
    conversations that lost a leading assistant turn are counted (leading_assistant_dropped)
    and each written row says so (dropped_leading_turns). A split left with no conversation is
    a DatasetError (and `dst_jsonl` is not written); its problems table then goes to
    `kept_problems_csv` when given (Snakemake removes a failed job's outputs, but keeps its
    logs).
    """
    if max_samples is not None and max_samples < 1:
        raise DatasetError(f"dataset.max_samples.{split} is {max_samples}; use null or >= 1")
    key = f"dataset.{split}" if split else "dataset.train / dataset.heldout"
    tokenizer = None
    if target is not None:
        from eyrie.target.load import load_tokenizer

        tokenizer = load_tokenizer(target)
    kept = prompts_only = opened_by_assistant = 0
    problems: list[Problem] = []
    stopped = False
    records = iter_chat(src, fmt, on_bad, key, regenerate, leading_assistant)
    with atomic_path(dst_jsonl) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as out:
        with closing(records):
            for item in records:
                if isinstance(item, Conversation) and tokenizer is not None:
                    item = unfit(item, src, tokenizer, int(max_tokens), regenerate) or item
                    if isinstance(item, Problem) and on_bad == "fail":
                        raise stops(item)
                if isinstance(item, Problem):
                    problems.append(item)
                    continue
                out.write(message_row(item, src))
                kept += 1
                prompts_only += not _answered(item)
                opened_by_assistant += DROPPED_TURNS in item.extra
                if max_samples is not None and kept >= max_samples:
                    stopped = True
                    break  # what follows is not written: it is not read
        if not kept:  # the split's file is not written (the temporary one is removed)
            table = Path(kept_problems_csv or problems_csv)
            write_problems(problems, table)
            raise DatasetError(nothing_usable(src, key, problems, table))
    write_problems(problems, problems_csv)
    if kept_problems_csv is not None:  # a failed run's table, now out of date
        Path(kept_problems_csv).unlink(missing_ok=True)
    bad = [p for p in problems if p.is_bad]
    counts = {
        "good": kept,
        "written": kept,
        "bad": len(bad),
        "blank_lines": len(problems) - len(bad),
        "by_kind": count_kinds(bad),
        "prompts_only": prompts_only,
        "leading_assistant_dropped": opened_by_assistant,
        "read_to_end": not stopped,
    }
    text = summary(src, kept, problems)
    if prompts_only:
        text += f" ({prompts_only} without an answer: the target will answer them)"
    if opened_by_assistant:
        text += dropped_text(opened_by_assistant) + " (dataset.leading_assistant: drop)"
    if stopped:
        text += f"; max_samples ({max_samples}) reached, the rest of the file is not read"
    print(f"{text}; wrote {kept} to {dst_jsonl}", flush=True)
    return counts


def _answered(conv: Conversation) -> bool:
    return any(m["role"] == "assistant" for m in conv.messages)


def nothing_usable(path, key: str | None, problems: list[Problem], table=None) -> str:
    """The message for a file without one usable conversation: what its lines were, the first
    problem, and where every problem is listed."""
    bad = [p for p in problems if p.is_bad]
    blank = len(problems) - len(bad)
    named = f"{key}: {path}" if key else str(path)
    if not bad:
        what = f"it is empty ({blank} blank lines)" if blank else "it is empty"
        fix = f"point {key} at a chat file" if key else "give a chat file"
        return f"{named} holds no conversation: {what}; {fix} with at least one conversation"
    kinds = ", ".join(f"{k}: {n}" for k, n in count_kinds(bad).items())
    listed = ("every one is" if len(bad) > 1 else "it is") + " listed"
    listed += f" in {table}" if table else " above"
    lines = f"all {len(bad)} of its lines are bad" if len(bad) > 1 else "its one line is bad"
    return (
        f"{named} holds no usable conversation: {lines} ({kinds})"
        f"{f', {blank} blank' if blank else ''}; {listed}. The first: {bad[0].describe()}"
    )
