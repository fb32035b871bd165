"""One dataset record (a JSONL line, or an element of a JSON array) checked and normalized to
OpenAI messages.

Three forms: OpenAI `messages` ({"role", "content"} turns; content a string or a list of text
parts), ShareGPT `conversations` ({"from", "value"} turns) and MT-bench questions
({"question_id", "category", "turns": ["first question", "second question"]}: user turns only,
a prompt for the target to answer). A record that cannot become a conversation raises `Bad`,
with a short kind and a reason that says how to fix it; eyrie/data/dataset.py turns it into a
row of the problems table.
"""

from __future__ import annotations

import json

FORMATS = ("auto", "messages", "sharegpt", "mtbench")
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
KEYS = {"messages": "messages", "sharegpt": "conversations", "mtbench": "turns"}
EXTRA_KEYS = ("category",)  # kept from a record (MT-bench's question category)
DROPPED_TURNS = "dropped_leading_turns"  # extra: assistant turns dropped before the first user


class Bad(Exception):
    """One record's problem: a short kind for the problems table and the reason with its fix."""

    def __init__(self, kind: str, reason: str, sample_id: str | None = None):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.sample_id = sample_id


def _sample_id(obj: dict, form: str, stem: str, number: int) -> str:
    key = "question_id" if form == "mtbench" and "question_id" in obj else "id"
    raw = obj.get(key)
    if raw is None:
        return f"{stem}-{number}"
    if isinstance(raw, bool) or not isinstance(raw, str | int) or str(raw).strip() == "":
        raise Bad("bad_id", f'"{key}" must be a non-empty string or an integer, got {raw!r}')
    return str(raw)


def _form(obj: dict, fmt: str) -> str:
    """The record's form: `fmt`, or under "auto" the first of messages, conversations and
    turns that the record has."""
    present = [form for form, key in KEYS.items() if key in obj]
    if fmt != "auto":
        if fmt in present:
            return fmt
        hint = f" (it has {KEYS[present[0]]!r}; set dataset.format: auto)" if present else ""
        raise Bad("no_messages", f'no "{KEYS[fmt]}" list{hint}')
    if not present:
        keys = ", ".join(sorted(map(str, obj))) or "none"
        raise Bad(
            "no_messages",
            f'neither "messages" (OpenAI form), "conversations" (ShareGPT form) nor "turns" '
            f"(MT-bench form); keys: {keys}",
        )
    return present[0]


def _turns(obj: dict, form: str) -> list:
    turns = obj[KEYS[form]]
    if not isinstance(turns, list) or not turns:
        what = "an empty list" if isinstance(turns, list) else type(turns).__name__
        raise Bad("no_messages", f"the {KEYS[form]} list is {what}; it needs at least one turn")
    return turns


def _normalize_turn(turn, i: int, form: str) -> dict:
    if form == "mtbench":  # a question: a string, asked by the user
        if not isinstance(turn, str) or not turn.strip():
            got = repr(turn)[:60]
            raise Bad("bad_content", f"turn {i} must be a non-empty string (a question), got {got}")
        return {"role": "user", "content": turn}
    if not isinstance(turn, dict):
        raise Bad("bad_content", f"turn {i} is a {type(turn).__name__}, not an object")
    if form == "messages":
        role, content = turn.get("role"), turn.get("content")
        if role not in ROLES:
            raise Bad("unknown_role", f"turn {i} has role {role!r}; use one of {list(ROLES)}")
    else:
        speaker, content = turn.get("from"), turn.get("value")
        role = SHAREGPT_ROLES.get(speaker.lower()) if isinstance(speaker, str) else None
        if role is None:
            allowed = sorted(SHAREGPT_ROLES)
            raise Bad("unknown_role", f'turn {i} has "from" {speaker!r}; use one of {allowed}')
    key = "content" if form == "messages" else "value"
    if form == "messages" and isinstance(content, list):
        content = _join_text_parts(content, i, role)
    if not isinstance(content, str) or not content.strip():
        got = "missing" if content is None else repr(content)[:60]
        raise Bad("bad_content", f'turn {i} ({role}) "{key}" must be a non-empty string, got {got}')
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
            raise Bad(
                "bad_content",
                f"turn {i} ({role}) content part {j} is {what}; only text parts "
                '({"type": "text", "text": "..."}) can be trained on: drop that part, or the line',
            )
        if not isinstance(part.get("text"), str):
            raise Bad(
                "bad_content",
                f'turn {i} ({role}) content part {j} has no "text" string; give it one',
            )
        texts.append(part["text"])
    if not texts:
        raise Bad("bad_content", f"turn {i} ({role}) content is an empty list of parts")
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
            raise Bad(
                "lone_surrogate",
                f"{where} has a lone surrogate escape {char} at character {exc.start + 1} (half "
                "of a UTF-16 pair, not a character); write the whole pair or the character "
                "itself, or remove the escape",
            ) from None


def _check_answers(messages: list[dict], prompts_ok: bool) -> None:
    """A conversation needs an assistant turn to learn from; with regeneration on
    (`prompts_ok`), user turns alone are a prompt the target answers."""
    if any(m["role"] == "assistant" for m in messages):
        return
    if not prompts_ok:
        raise Bad(
            "no_assistant_turn",
            "no assistant turn, so there is nothing to learn from (with regenerate.enabled: "
            "true the target would answer its user turns)",
        )
    if not any(m["role"] == "user" for m in messages):
        raise Bad(
            "no_assistant_turn",
            "no assistant turn and no user turn: nothing to learn from, and nothing for the "
            "target to answer",
        )


def decode_line(raw: bytes) -> object:
    """The JSON value of one JSONL line; raises Bad (not_utf8, malformed_json)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 1].hex()
        raise Bad(
            "not_utf8",
            f"byte 0x{bad} at column {exc.start + 1} is not UTF-8; re-encode the file as UTF-8",
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise Bad("malformed_json", f"invalid JSON at column {exc.colno}: {exc.msg}") from None


def parse_record(
    obj: object,
    fmt: str,
    stem: str,
    number: int,
    prompts_ok: bool = False,
    leading_assistant: str = "drop",
) -> tuple[str, list[dict], dict]:
    """(id, normalized messages, extra fields kept) of one record; raises Bad with the problem.

    `number` names a record without an id (STEM-NUMBER); `prompts_ok` keeps a conversation
    without an assistant turn (regeneration answers it). `leading_assistant` "drop" removes
    assistant turns that come before the first user turn (`drop_leading_assistant`), and extra
    then counts them (dropped_leading_turns); "bad" leaves them for the chat template, which
    refuses them (assistant_first)."""
    if not isinstance(obj, dict):
        raise Bad("not_an_object", f"a JSON {type(obj).__name__}, not an object")
    try:
        form, no_form = _form(obj, fmt), None
    except Bad as bad:
        form, no_form = None, bad
    sid = _sample_id(obj, form or "messages", stem, number)
    try:
        if no_form is not None:
            raise no_form
        messages = [_normalize_turn(t, i, form) for i, t in enumerate(_turns(obj, form))]
        dropped = 0
        if leading_assistant == "drop":
            messages, dropped = drop_leading_assistant(messages)
        _check_answers(messages, prompts_ok)
        _check_unicode(sid, messages, {"messages": "content", "sharegpt": "value"}.get(form, "turn"))
    except Bad as bad:
        bad.sample_id = sid.encode("utf-8", "backslashreplace").decode("utf-8")  # printable
        raise
    extra = {k: obj[k] for k in EXTRA_KEYS if isinstance(obj.get(k), str)}
    if dropped:
        extra[DROPPED_TURNS] = dropped
    return sid, messages, extra


def drop_leading_assistant(messages: list[dict]) -> tuple[list[dict], int]:
    """The messages without the assistant turns before the first user turn, and how many there
    were. ShareGPT's split file cuts long conversations into parts, and a later part opens with
    the assistant's continuation: an answer whose question is in another record. FastChat,
    EAGLE and SpecForge drop that turn and keep the rest; so does Eyrie by default."""
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), len(messages))
    keep = [m for m in messages[:first_user] if m["role"] != "assistant"]
    dropped = first_user - len(keep)
    return (keep + messages[first_user:], dropped) if dropped else (messages, 0)
