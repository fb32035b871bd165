"""Build Eyrie's shipped chat dataset from the Python standard library's own documentation.

The default workflow needs chat text that is available offline and free to redistribute: the
docstrings of the standard library and `pydoc_data.topics` (both under the Python Software
Foundation License) are on every machine that runs Eyrie. They become OpenAI `messages`
conversations: questions about functions, classes and methods; module overviews with
follow-ups; and language topics explained over several turns.

The build is deterministic: modules and members are walked in sorted order, every random choice
comes from an RNG seeded by (seed, conversation id), and the result depends only on the Python
version (and the platform's set of built extension modules), which the datasheet records.
"""

from __future__ import annotations

import hashlib
import random
import re

from eyrie.data.stdlib_docs import MIN_DOC_CHARS, Entry, ModuleDoc, collect_modules

SEED = 0
MAX_ANSWER_CHARS = 1200
MAX_MODULE_CHARS = 800
HELDOUT_PERCENT = 8

SYSTEM_PROMPTS = [
    "Answer questions about the Python standard library. Quote its documentation where it helps.",
    "You explain Python's standard library to working programmers, briefly and precisely.",
    "You are a Python reference desk. Give the signature first, then the explanation.",
    "Help the user understand Python. Prefer the official documentation's wording.",
]
SYSTEM_PROMPT_RATE = 0.25

OBJECT_QUESTIONS = [
    "What does `{name}` do?",
    "What is `{name}` for?",
    "How do I use `{name}`?",
    "Can you explain `{name}`?",
    "Explain the {kind} `{name}`.",
    "I keep seeing `{name}` in code. What does it do?",
    "What does the {kind} `{name}` do in Python?",
    "Tell me about `{name}`.",
    "Could you describe the {kind} `{name}` from the `{module}` module?",
]
MODULE_QUESTIONS = [
    "What is the `{name}` module for?",
    "What does the `{name}` module do?",
    "Give me an overview of Python's `{name}` module.",
    "What is `{name}` in the standard library?",
    "When would I reach for the `{name}` module?",
]
FOLLOW_UPS = [
    "And what does `{name}` do?",
    "What about `{name}`?",
    "How does `{name}` work?",
    "Can you explain `{name}` from that module?",
]
TOPIC_QUESTIONS = [
    "Explain {title} in Python.",
    "How does {title} work in Python?",
    "Can you describe {title}?",
    "What should I know about {title} in Python?",
]
INDEX_QUESTIONS = [
    "What functions and classes does the `{name}` module provide?",
    "List the main things in `{name}`.",
    "What can I find in Python's `{name}` module?",
    "Give me a quick tour of what `{name}` offers.",
]
MEMBER_QUESTIONS = [
    "What methods does `{name}` have?",
    "Which operations does the `{name}` class support?",
    "Summarize the API of `{name}`.",
    "What can I do with a `{name}` object?",
]
MAX_LISTED = 12
CONTINUE_QUESTIONS = [
    "Go on.",
    "Please continue.",
    "What else should I know about it?",
    "Tell me more.",
]


# ---------------------------------------------------------------- text shaping


def trim(text: str, limit: int = MAX_ANSWER_CHARS) -> str:
    """Keep whole paragraphs up to `limit` characters; cut a lone long paragraph at a line end."""
    out = ""
    for para in text.split("\n\n"):
        candidate = f"{out}\n\n{para}" if out else para
        if len(candidate) > limit:
            break
        out = candidate
    if out:
        truncated = len(out) < len(text.strip())
        while truncated and out.rstrip().endswith(":") and "\n\n" in out:
            out = out.rsplit("\n\n", 1)[0]  # an intro to a block that was cut away
        return out
    lines, kept = text.split("\n"), ""
    for line in lines:
        candidate = f"{kept}\n{line}" if kept else line
        if len(candidate) > limit:
            break
        kept = candidate
    return kept or text[:limit].rsplit(" ", 1)[0]


def chunks(text: str, limit: int = MAX_ANSWER_CHARS) -> list[str]:
    """Split a long text into consecutive pieces of whole paragraphs, each within `limit`."""
    pieces, rest = [], text.strip()
    while rest:
        piece = trim(rest, limit)
        pieces.append(piece)
        rest = rest[len(piece) :].strip()
    return pieces


def object_answer(e: Entry) -> str:
    body = trim(e.doc)
    if e.signature:
        prefix = "class " if e.kind == "class" else ""
        return f"```python\n{prefix}{e.signature}\n```\n\n{body}"
    return body


def module_answer(m: ModuleDoc) -> str:
    body = trim(m.doc or "", MAX_MODULE_CHARS)
    names = sorted({e.qualname.split(".")[len(m.name.split("."))] for e in m.entries})
    if names:
        shown = ", ".join(f"`{n}`" for n in names[:8])
        more = " among others" if len(names) > 8 else ""
        body += f"\n\nIts documented public names include {shown}{more}."
    return body


_HEADING = re.compile(r"\n\n([^\n]+)\n(?:=+|-+)\n")


def _title(line: str) -> str:
    title = line.strip().replace('"', "`")
    return "the " + title[4:] if title.startswith("The ") else title


def topic_sections(text: str) -> list[tuple[str, str]]:
    """(title, body) for a pydoc topic: its introduction, then each underlined subsection."""
    lines = text.strip().split("\n")
    if len(lines) < 3 or not set(lines[1]) <= {"*"}:
        return []
    rest = "\n\n" + "\n".join(lines[2:]).strip() + "\n"
    parts = _HEADING.split(rest)
    sections = [(_title(lines[0]), parts[0].strip())]
    pairs = zip(parts[1::2], parts[2::2], strict=True)
    sections += [(_title(t), body.strip()) for t, body in pairs]
    return [(t, b) for t, b in sections if len(b) >= MIN_DOC_CHARS]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# ---------------------------------------------------------------- conversations


def _rng(seed: int, cid: str) -> random.Random:
    return random.Random(f"{seed}:{cid}")


def _with_system(rng: random.Random, messages: list[dict]) -> list[dict]:
    if rng.random() < SYSTEM_PROMPT_RATE:
        return [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}, *messages]
    return messages


def object_conversation(e: Entry, seed: int) -> dict:
    cid = f"pydoc-{e.kind}-{e.qualname}"
    rng = _rng(seed, cid)
    q = rng.choice(OBJECT_QUESTIONS).format(name=e.qualname, kind=e.kind, module=e.module)
    msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": object_answer(e)}]
    return {"id": cid, "messages": _with_system(rng, msgs)}


def module_conversation(m: ModuleDoc, seed: int) -> dict:
    cid = f"pydoc-module-{m.name}"
    rng = _rng(seed, cid)
    q = rng.choice(MODULE_QUESTIONS).format(name=m.name)
    msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": module_answer(m)}]
    top = [e for e in m.entries if e.kind in ("function", "class")] or m.entries
    picks = rng.sample(top, k=min(len(top), rng.choice([1, 1, 2])))
    for e in sorted(picks, key=lambda x: x.qualname):
        msgs.append({"role": "user", "content": rng.choice(FOLLOW_UPS).format(name=e.qualname)})
        msgs.append({"role": "assistant", "content": object_answer(e)})
    return {"id": cid, "messages": _with_system(rng, msgs)}


def summary(doc: str, limit: int = 160) -> str:
    """The first sentence of a docstring's first paragraph, on one line."""
    para = " ".join(doc.split("\n\n", 1)[0].split())
    match = re.search(r"(?<=[.!?])\s", para)
    sentence = para[: match.start()] if match else para
    return sentence if len(sentence) <= limit else sentence[:limit].rsplit(" ", 1)[0] + " …"


def listing(intro: str, entries: list[Entry], prefix_len: int) -> str:
    lines = [intro, ""]
    for e in entries[:MAX_LISTED]:
        lines.append(f"- `{e.qualname[prefix_len:]}` ({e.kind}): {summary(e.doc)}")
    if len(entries) > MAX_LISTED:
        lines.append(f"\n…and {len(entries) - MAX_LISTED} more documented names.")
    return "\n".join(lines)


def index_conversation(m: ModuleDoc, seed: int) -> dict:
    """A module's top-level functions and classes, each with its one-line summary."""
    cid = f"pydoc-index-{m.name}"
    rng = _rng(seed, cid)
    top = [e for e in m.entries if e.qualname.count(".") == m.name.count(".") + 1]
    answer = listing(f"The `{m.name}` module documents these names:", top, len(m.name) + 1)
    q = rng.choice(INDEX_QUESTIONS).format(name=m.name)
    msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": answer}]
    return {"id": cid, "messages": _with_system(rng, msgs)}


def members_conversation(cls: Entry, members: list[Entry], seed: int) -> dict:
    """A class's documented methods and attributes, each with its one-line summary."""
    cid = f"pydoc-members-{cls.qualname}"
    rng = _rng(seed, cid)
    intro = f"`{cls.qualname}`: {summary(cls.doc)} Its documented members:"
    answer = listing(intro, members, len(cls.qualname) + 1)
    q = rng.choice(MEMBER_QUESTIONS).format(name=cls.qualname)
    msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": answer}]
    return {"id": cid, "messages": _with_system(rng, msgs)}


def listing_conversations(m: ModuleDoc, seed: int) -> list[dict]:
    convs = []
    depth = m.name.count(".") + 1
    if sum(e.qualname.count(".") == depth for e in m.entries) >= 2:
        convs.append(index_conversation(m, seed))
    for cls in (e for e in m.entries if e.kind == "class"):
        members = [e for e in m.entries if e.qualname.rsplit(".", 1)[0] == cls.qualname]
        if len(members) >= 3:
            convs.append(members_conversation(cls, members, seed))
    return convs


def topic_conversation(cid: str, title: str, body: str, seed: int) -> dict:
    pieces = chunks(body)
    rng = _rng(seed, cid)
    msgs = [
        {"role": "user", "content": rng.choice(TOPIC_QUESTIONS).format(title=title)},
        {"role": "assistant", "content": pieces[0]},
    ]
    for piece in pieces[1 : 1 + rng.choice([0, 1, 2])]:
        msgs.append({"role": "user", "content": rng.choice(CONTINUE_QUESTIONS)})
        msgs.append({"role": "assistant", "content": piece})
    return {"id": cid, "messages": _with_system(rng, msgs)}


def topic_conversations(topics: dict[str, str], seed: int) -> list[dict]:
    """One conversation per topic, then one per subsection not already a topic of its own."""
    convs, titles = [], set()
    sections = {key: topic_sections(topics[key]) for key in sorted(topics)}
    for key, secs in sections.items():
        if secs:
            titles.add(secs[0][0].lower())
            convs.append(topic_conversation(f"pydoc-topic-{key}", *secs[0], seed))
    for key, secs in sections.items():
        for title, body in secs[1:]:
            if title.lower() not in titles:
                titles.add(title.lower())
                cid = f"pydoc-topic-{key}-{_slug(title)}"
                convs.append(topic_conversation(cid, title, body, seed))
    return convs


def build(seed: int = SEED) -> list[dict]:
    """All conversations, deduplicated on their answers, in a seeded shuffled order."""
    from pydoc_data.topics import topics

    modules = collect_modules()
    convs: list[dict] = []
    for m in modules:
        if m.doc:
            convs.append(module_conversation(m, seed))
        convs.extend(object_conversation(e, seed) for e in m.entries)
        convs.extend(listing_conversations(m, seed))
    convs.extend(topic_conversations(topics, seed))

    seen_ids, seen_answers, out = set(), set(), []
    for conv in convs:
        answers = tuple(m["content"] for m in conv["messages"] if m["role"] == "assistant")
        if conv["id"] in seen_ids or answers in seen_answers:
            continue
        seen_ids.add(conv["id"])
        seen_answers.add(answers)
        out.append(conv)
    out.sort(key=lambda c: c["id"])
    random.Random(seed).shuffle(out)
    return out


def split_of(cid: str, heldout_percent: int = HELDOUT_PERCENT) -> str:
    """A fixed split from the id alone, so adding conversations never moves existing ones."""
    bucket = int(hashlib.sha256(cid.encode()).hexdigest()[:8], 16) % 100
    return "heldout" if bucket < heldout_percent else "train"
