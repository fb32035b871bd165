"""Read chat JSONL (OpenAI `messages` or ShareGPT `conversations`) and account for every line.

A turn's content is a string, or (OpenAI form) a list of text parts, which are joined with a
newline (`_join_text_parts` says why). Bad input is never dropped silently: each line that
cannot become a conversation is a `Problem` with its line number, a short `kind` and a reason
that says how to fix it. Under the `skip` policy problems are counted and returned; under
`fail` the first one raises `DatasetError`.

Problem kinds: not_utf8, malformed_json, lone_surrogate, not_an_object, bad_id, no_messages,
unknown_role, bad_content, no_assistant_turn, duplicate_id; with the target's tokenizer
(`fitting`) also prompt_too_long and the chat template's refusals (template_error,
assistant_first, not_prefix_stable). A blank line holds no sample, so it
is reported as kind `blank_line`, a notice: it is listed and counted, but is never "bad" and
never fails a run (a file that ends with an extra newline is not an error; a file that is mostly
blank lines still shows up in the counts).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from eyrie.common.atomic import write_text
from eyrie.common.errors import EyrieError
from eyrie.data.chat_tokens import unusable

FORMATS = ("auto", "messages", "sharegpt")
POLICIES = ("skip", "fail")
ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
}
NOTICE_KINDS = frozenset({"blank_line"})
PROBLEM_COLUMNS = ["path", "line", "kind", "reason", "sample_id"]
SKIP_HINT = "set dataset.on_bad_input: skip to count and skip such lines"


class DatasetError(EyrieError, ValueError):
    """A dataset that cannot be read; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class Conversation:
    id: str
    messages: list[dict]  # [{"role": "system"|"user"|"assistant", "content": str}, ...]
    line: int


@dataclass(frozen=True)
class Problem:
    path: str
    line: int
    kind: str
    reason: str
    sample_id: str | None = None

    @property
    def is_bad(self) -> bool:
        """False for notices (blank lines), which never fail a run."""
        return self.kind not in NOTICE_KINDS

    def describe(self) -> str:
        sid = f" (id {self.sample_id})" if self.sample_id else ""
        return f"{self.path}:{self.line}: {self.kind}{sid}: {self.reason}"


class _Bad(Exception):
    """One line's problem, raised inside the parser and turned into a Problem by read_chat."""

    def __init__(self, kind: str, reason: str, sample_id: str | None = None):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.sample_id = sample_id


# ---------------------------------------------------------------- one line


def _sample_id(obj: dict, stem: str, lineno: int) -> str:
    raw = obj.get("id")
    if raw is None:
        return f"{stem}-{lineno}"
    if isinstance(raw, bool) or not isinstance(raw, str | int) or str(raw).strip() == "":
        raise _Bad("bad_id", f'"id" must be a non-empty string or an integer, got {raw!r}')
    return str(raw)


def _turns(obj: dict, fmt: str) -> tuple[str, list]:
    """The line's form ("messages" or "sharegpt") and its raw list of turns."""
    has_m, has_c = "messages" in obj, "conversations" in obj
    if fmt == "messages" and not has_m:
        hint = " (it has ShareGPT `conversations`; set dataset.format: auto)" if has_c else ""
        raise _Bad("no_messages", f'no "messages" list{hint}')
    if fmt == "sharegpt" and not has_c:
        hint = " (it has OpenAI `messages`; set dataset.format: auto)" if has_m else ""
        raise _Bad("no_messages", f'no "conversations" list{hint}')
    if fmt == "auto" and not (has_m or has_c):
        keys = ", ".join(sorted(map(str, obj))) or "none"
        raise _Bad(
            "no_messages",
            f'neither "messages" (OpenAI form) nor "conversations" (ShareGPT form); keys: {keys}',
        )
    form = "messages" if (fmt == "messages" or (fmt == "auto" and has_m)) else "sharegpt"
    turns = obj["messages" if form == "messages" else "conversations"]
    if not isinstance(turns, list) or not turns:
        what = "an empty list" if isinstance(turns, list) else type(turns).__name__
        raise _Bad("no_messages", f"the {form} list is {what}; it needs at least one turn")
    return form, turns


def _normalize_turn(turn, i: int, form: str) -> dict:
    if not isinstance(turn, dict):
        raise _Bad("bad_content", f"turn {i} is a {type(turn).__name__}, not an object")
    if form == "messages":
        role, content = turn.get("role"), turn.get("content")
        if role not in ROLES:
            raise _Bad("unknown_role", f"turn {i} has role {role!r}; use one of {list(ROLES)}")
    else:
        speaker, content = turn.get("from"), turn.get("value")
        role = SHAREGPT_ROLES.get(speaker.lower()) if isinstance(speaker, str) else None
        if role is None:
            allowed = sorted(SHAREGPT_ROLES)
            raise _Bad("unknown_role", f'turn {i} has "from" {speaker!r}; use one of {allowed}')
    key = "content" if form == "messages" else "value"
    if form == "messages" and isinstance(content, list):
        content = _join_text_parts(content, i, role)
    if not isinstance(content, str) or not content.strip():
        got = "missing" if content is None else repr(content)[:60]
        raise _Bad(
            "bad_content", f'turn {i} ({role}) "{key}" must be a non-empty string, got {got}'
        )
    return {"role": role, "content": content}


def _join_text_parts(parts: list, i: int, role: str) -> str:
    """OpenAI's list-of-parts content as one string: the text parts joined by a newline, as
    vLLM joins them for a chat template that takes a string (SGLang joins with a space, and
    templates that walk the parts themselves join with nothing; a newline keeps two parts from
    running into one word). A part that is not text (an image, audio, a file) makes the line
    bad: the target would see something the text-only store cannot hold."""
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            what = f"of type {kind!r}" if kind else f"a {type(part).__name__}, not a typed part"
            raise _Bad(
                "bad_content",
                f"turn {i} ({role}) content part {j} is {what}; only text parts "
                '({"type": "text", "text": "..."}) can be trained on: drop that part, or the line',
            )
        if not isinstance(part.get("text"), str):
            raise _Bad(
                "bad_content",
                f'turn {i} ({role}) content part {j} has no "text" string; give it one',
            )
        texts.append(part["text"])
    if not texts:
        raise _Bad("bad_content", f"turn {i} ({role}) content is an empty list of parts")
    return "\n".join(texts)


def _check_unicode(sid: str, messages: list[dict], form_key: str) -> None:
    """A lone surrogate escape (e.g. "\\ud83d" without its pair) is valid JSON but no text:
    it cannot be written as UTF-8 or tokenized, so the line is bad."""
    texts = [("the id", sid)]
    texts += [
        (f'turn {i} ({m["role"]}) "{form_key}"', m["content"]) for i, m in enumerate(messages)
    ]
    for where, text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            char = f"\\u{ord(text[exc.start]):04x}"
            raise _Bad(
                "lone_surrogate",
                f"{where} has a lone surrogate escape {char} at character {exc.start + 1} (half "
                "of a UTF-16 pair, not a character); write the whole pair or the character "
                "itself, or remove the escape",
            ) from None


def _parse_line(raw: bytes, fmt: str, stem: str, lineno: int) -> tuple[str, list[dict]]:
    """(id, normalized messages) of one JSONL line; raises _Bad with the problem."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 1].hex()
        raise _Bad(
            "not_utf8",
            f"byte 0x{bad} at column {exc.start + 1} is not UTF-8; re-encode the file as UTF-8",
        ) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Bad("malformed_json", f"invalid JSON at column {exc.colno}: {exc.msg}") from None
    if not isinstance(obj, dict):
        raise _Bad("not_an_object", f"the line is a JSON {type(obj).__name__}, not an object")
    sid = _sample_id(obj, stem, lineno)
    try:
        form, turns = _turns(obj, fmt)
        messages = [_normalize_turn(t, i, form) for i, t in enumerate(turns)]
        if not any(m["role"] == "assistant" for m in messages):
            raise _Bad("no_assistant_turn", "no assistant turn, so there is nothing to learn from")
        _check_unicode(sid, messages, "content" if form == "messages" else "value")
    except _Bad as bad:
        bad.sample_id = sid.encode("utf-8", "backslashreplace").decode("utf-8")  # printable
        raise
    return sid, messages


# ---------------------------------------------------------------- a file


def _check_choice(value: str, allowed: tuple[str, ...], key: str) -> None:
    if value not in allowed:
        raise DatasetError(f"{key} is {value!r}; use one of {list(allowed)}")


def read_chat(
    path: str | Path,
    fmt: str = "auto",
    on_bad: str = "skip",
    key: str | None = "dataset.train / dataset.heldout",
) -> tuple[list[Conversation], list[Problem]]:
    """Every good conversation of a chat JSONL file, and a Problem for every other line.

    `fmt` "auto" decides per line (a "messages" key wins over "conversations"). `key` is the
    config key that names this file, quoted when it is missing (None: the path is not from a
    config). Under `on_bad="fail"` the first bad line raises DatasetError; notices (blank lines)
    never do.
    """
    _check_choice(fmt, FORMATS, "dataset.format")
    _check_choice(on_bad, POLICIES, "dataset.on_bad_input")
    path = Path(path)
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        fix = f"set {key} in the config to a chat JSONL file" if key else "check the path"
        raise DatasetError(f"dataset file {path} {what}; {fix}")
    stem, shown = path.stem, str(path)
    convs: list[Conversation] = []
    problems: list[Problem] = []
    first_line: dict[str, int] = {}
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte order mark, as some editors write
            raw = raw.rstrip(b"\r\n")
            if not raw.strip():
                problems.append(Problem(shown, lineno, "blank_line", "blank line (harmless)"))
                continue
            try:
                sid, messages = _parse_line(raw, fmt, stem, lineno)
                if sid in first_line:
                    where = f"id already used on line {first_line[sid]}; ids must be unique"
                    raise _Bad("duplicate_id", where, sid)
            except _Bad as bad:
                problem = Problem(shown, lineno, bad.kind, bad.reason, bad.sample_id)
                if on_bad == "fail":
                    raise DatasetError(
                        f"{problem.describe()}\nFix the line, or {SKIP_HINT}."
                    ) from None
                problems.append(problem)
                continue
            first_line[sid] = lineno
            convs.append(Conversation(sid, messages, lineno))
    return convs, problems


def count_kinds(problems: list[Problem]) -> dict[str, int]:
    return dict(sorted(Counter(p.kind for p in problems).items()))


def summary(path: str | Path, convs: list[Conversation], problems: list[Problem]) -> str:
    """One line: good conversations, bad lines by kind, blank lines."""
    bad = [p for p in problems if p.is_bad]
    text = f"{path}: {len(convs)} good, {len(bad)} bad"
    if bad:
        text += " (" + ", ".join(f"{k}: {n}" for k, n in count_kinds(bad).items()) + ")"
    if len(problems) > len(bad):
        text += f", {len(problems) - len(bad)} blank lines"
    return text


# ---------------------------------------------------------------- the target's template


def fitting(
    convs: list[Conversation],
    path: str | Path,
    tokenizer,
    max_tokens: int,
    *,
    on_bad: str = "skip",
    limit: int | None = None,
) -> tuple[list[Conversation], list[Problem]]:
    """The conversations extraction can use (the first `limit` of them), and a Problem for each
    one checked that it cannot: tokenized with the target's chat template as extraction does,
    answers past `max_tokens` are cut and kept, but a prompt that alone fills `max_tokens`
    leaves no answer token, and a conversation the template refuses has no tokens at all.
    Checked when the dataset is prepared, not after the whole extraction. Under on_bad "fail"
    the first such problem raises DatasetError."""
    kept: list[Conversation] = []
    problems: list[Problem] = []
    for conv in convs:
        if limit is not None and len(kept) >= limit:
            break  # the rest are not written, so they need no check
        verdict = unusable(tokenizer, conv.messages, max_tokens)
        if verdict is None:
            kept.append(conv)
            continue
        problem = Problem(str(path), conv.line, *verdict, conv.id)
        if on_bad == "fail":
            raise DatasetError(f"{problem.describe()}\nFix the line, or {SKIP_HINT}.")
        problems.append(problem)
    return kept, problems


# ---------------------------------------------------------------- writing


def problems_frame(problems: list[Problem]) -> pd.DataFrame:
    rows = [[p.path, p.line, p.kind, p.reason, p.sample_id] for p in problems]
    return pd.DataFrame(rows, columns=PROBLEM_COLUMNS).astype({"line": "int64"})


def write_problems(problems: list[Problem], path: str | Path) -> None:
    """The problems table as CSV (header even when empty), written atomically."""
    write_text(path, problems_frame(problems).to_csv(index=False))


def write_messages(convs: list[Conversation], path: str | Path, source=None) -> None:
    """Messages JSONL; with `source` (the file read), each line also names its line there as
    "source": "FILE:LINE", which later stages quote instead of this file's line numbers."""

    def row(c: Conversation) -> dict:
        out = {"id": c.id, "messages": c.messages}
        if source is not None:
            out["source"] = f"{source}:{c.line}"
        return out

    lines = (json.dumps(row(c), ensure_ascii=False) for c in convs)
    write_text(path, "".join(f"{line}\n" for line in lines))


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
) -> dict:
    """Normalize a chat file for one split: the first `max_samples` good conversations (file
    order) as messages JSONL, and every problem as CSV. Returns the counts it prints.

    With `target` (a model folder) each conversation is also tokenized with its chat template
    as extraction will (`fitting`): one whose prompt alone fills `max_tokens`, or that the
    template cannot render, is a bad line. A split left with no conversation is a DatasetError;
    its problems table then goes to `kept_problems_csv` when given (Snakemake removes a failed
    job's outputs, but keeps its logs).
    """
    if max_samples is not None and max_samples < 1:
        raise DatasetError(f"dataset.max_samples.{split} is {max_samples}; use null or >= 1")
    key = f"dataset.{split}" if split else "dataset.train / dataset.heldout"
    convs, problems = read_chat(src, fmt=fmt, on_bad=on_bad, key=key)
    if target is not None:
        from eyrie.target.load import load_tokenizer

        tokenizer = load_tokenizer(target)
        kept, unfit = fitting(
            convs, src, tokenizer, int(max_tokens), on_bad=on_bad, limit=max_samples
        )
        unfit_lines = {p.line for p in unfit}
        convs = [c for c in convs if c.line not in unfit_lines]
        problems = sorted(problems + unfit, key=lambda p: p.line)
    else:
        kept = convs if max_samples is None else convs[:max_samples]
    if not kept:
        table = Path(kept_problems_csv or problems_csv)
        write_problems(problems, table)
        raise DatasetError(nothing_usable(src, key, problems, table))
    write_messages(kept, dst_jsonl, source=src)
    write_problems(problems, problems_csv)
    if kept_problems_csv is not None:  # a failed run's table, now out of date
        Path(kept_problems_csv).unlink(missing_ok=True)
    bad = [p for p in problems if p.is_bad]
    counts = {
        "good": len(convs),
        "written": len(kept),
        "bad": len(bad),
        "blank_lines": len(problems) - len(bad),
        "by_kind": count_kinds(bad),
    }
    print(f"{summary(src, convs, problems)}; wrote {len(kept)} to {dst_jsonl}", flush=True)
    return counts


def nothing_usable(path, key: str | None, problems: list[Problem], table=None) -> str:
    """The message for a file without one usable conversation: what its lines were, the first
    problem, and where every problem is listed."""
    bad = [p for p in problems if p.is_bad]
    blank = len(problems) - len(bad)
    named = f"{key}: {path}" if key else str(path)
    if not bad:
        what = f"it is empty ({blank} blank lines)" if blank else "it is empty"
        fix = f"point {key} at a chat JSONL file" if key else "give a chat JSONL file"
        return f"{named} holds no conversation: {what}; {fix} with at least one conversation"
    kinds = ", ".join(f"{k}: {n}" for k, n in count_kinds(bad).items())
    listed = ("every one is" if len(bad) > 1 else "it is") + " listed"
    listed += f" in {table}" if table else " above"
    lines = f"all {len(bad)} of its lines are bad" if len(bad) > 1 else "its one line is bad"
    return (
        f"{named} holds no usable conversation: {lines} ({kinds})"
        f"{f', {blank} blank' if blank else ''}; {listed}. The first: {bad[0].describe()}"
    )
