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

import contextlib
import hashlib
import importlib
import inspect
import io
import json
import os
import pkgutil
import platform
import random
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from eyrie.common.atomic import write_text

SEED = 0
MAX_ANSWER_CHARS = 1200
MAX_MODULE_CHARS = 800
MIN_DOC_CHARS = 20
HELDOUT_PERCENT = 8
MAX_TOTAL_BYTES = 12_000_000

# Top-level modules that are tests, GUI toolkits, deprecated, or act when imported
# (print, open a browser, write grammar caches, touch the terminal).
SKIP_TOP = {
    "antigravity",
    "idlelib",
    "lib2to3",
    "distutils",
    "readline",
    "rlcompleter",
    "test",
    "this",
    "tkinter",
    "turtle",
    "turtledemo",
    "pydoc_data",
}
# Submodule name parts that are never walked: tests, command-line entry points, per-codec tables.
SKIP_PARTS = {"test", "tests", "idle_test", "__main__"}
SKIP_PREFIXES = ("encodings.",)
# Modules better known by the name programs use for them.
DISPLAY_NAMES = {"posixpath": "os.path"}

# Boilerplate that C types and enums inherit; it says nothing about the object itself.
GENERIC_DOCS = (
    "An enumeration.",
    "Create and return a new object.",
    "Initialize self.",
    "Helper for pickle.",
    "Alias for field number",
)

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


@dataclass
class Entry:
    """One documented object: a function, class or method."""

    qualname: str  # e.g. "json.dumps", "json.JSONEncoder.encode"
    module: str
    kind: str  # function | class | method | attribute | object
    signature: str | None
    doc: str


@dataclass
class ModuleDoc:
    name: str
    doc: str | None
    entries: list[Entry] = field(default_factory=list)


# ---------------------------------------------------------------- walking the standard library


def _skip(name: str) -> bool:
    parts = name.split(".")
    if parts[0] in SKIP_TOP or name.startswith(SKIP_PREFIXES):
        return True
    return any(p.startswith("_") or p in SKIP_PARTS for p in parts)


def _quiet_import(name: str):
    """Import a module with its output and warnings swallowed; None when it cannot be imported."""
    sink = io.StringIO()
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
        ):
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - a module that fails to import (or exits) is skipped
        return None


def stdlib_module_names() -> list[str]:
    """Every importable public stdlib module (packages walked recursively), sorted."""
    found: set[str] = set()

    def visit(name: str) -> None:
        if _skip(name) or name in found:
            return
        mod = _quiet_import(name)
        if mod is None:
            return
        found.add(name)
        for info in pkgutil.iter_modules(getattr(mod, "__path__", None) or []):
            visit(f"{name}.{info.name}")

    for top in sorted(sys.stdlib_module_names):
        visit(top)
    return sorted(found)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class _SortedRepr:
    """Stands in for a set default so its repr does not depend on the hash seed."""

    def __init__(self, value):
        self.value = value

    def __repr__(self) -> str:
        name = type(self.value).__name__
        body = ", ".join(sorted(repr(v) for v in self.value))
        return f"{name}({{{body}}})" if body else f"{name}()"


# Defaults computed from the running interpreter's environment when their module is imported
# (sysconfig's scheme is "venv" inside a virtualenv, "posix_prefix" outside): shown as the
# expression the source writes, so the dataset does not depend on where it is rebuilt.
_ENVIRONMENT_DEFAULTS = {("sysconfig", "scheme"): "get_default_scheme()"}


class _ShownAs:
    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _machine_strings() -> list[str]:
    """Strings that would tie the dataset to this machine (paths, user names)."""
    values = {sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix, os.getcwd()}
    values |= {os.path.dirname(os.__file__)}
    values.add(os.path.expanduser("~"))
    return sorted(v for v in values if v and len(v) > 1)


def _signature(obj, shown_name: str) -> str | None:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = []
    for p in sig.parameters.values():
        shown = _ENVIRONMENT_DEFAULTS.get((getattr(obj, "__module__", None), p.name))
        if shown is not None and p.default is not p.empty:
            p = p.replace(default=_ShownAs(shown))
        elif isinstance(p.default, set | frozenset):
            p = p.replace(default=_SortedRepr(p.default))
        params.append(p)
    try:
        text = f"{shown_name}{sig.replace(parameters=params)}"
    except (TypeError, ValueError):
        return None
    text = _ADDRESS.sub("", text)
    if any(s in text for s in _machine_strings()):
        return None
    return text


def _own_doc(obj) -> str | None:
    """The object's own docstring (not one inherited from a base class), cleaned."""
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str):
        return None
    doc = inspect.cleandoc(doc).strip()
    if len(doc) < MIN_DOC_CHARS or doc.startswith(GENERIC_DOCS):
        return None
    return doc


def _public_names(mod) -> list[str]:
    names = getattr(mod, "__all__", None)
    if isinstance(names, list | tuple) and all(isinstance(n, str) for n in names):
        return sorted(n for n in set(names) if not n.startswith("_"))
    out = []
    for name, value in vars(mod).items():
        if name.startswith("_"):
            continue
        if getattr(value, "__module__", None) == mod.__name__:
            out.append(name)
    return sorted(out)


# Dunder methods whose docstrings describe pickling or interpreter plumbing, not the class.
SKIP_DUNDERS = {
    "__class_getitem__",
    "__getnewargs__",
    "__getnewargs_ex__",
    "__getstate__",
    "__init_subclass__",
    "__reduce__",
    "__reduce_ex__",
    "__setstate__",
    "__sizeof__",
    "__subclasshook__",
}


def _callable_member(value):
    """The underlying function of a class attribute, or None for data and nested types."""
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    if inspect.isfunction(value) or inspect.isbuiltin(value) or inspect.ismethoddescriptor(value):
        return value
    return None


def _own_instance_doc(value) -> bool:
    """A module-level instance (not a routine or module) documented apart from its type."""
    if inspect.ismodule(value) or inspect.isroutine(value):
        return False
    doc = getattr(value, "__doc__", None)
    return isinstance(doc, str) and doc != getattr(type(value), "__doc__", None)


def _is_attribute(value) -> bool:
    return (
        isinstance(value, property)
        or inspect.isgetsetdescriptor(value)
        or inspect.ismemberdescriptor(value)
    )


def _class_members(cls) -> Iterator[tuple[str, object]]:
    """(name, raw attribute) the class documents: its own public and special methods, plus the
    public ones it inherits from private base classes (whose docs appear nowhere else)."""
    for name in sorted(dir(cls)):
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        if owner is None:
            continue
        dunder = name.startswith("__") and name.endswith("__")
        if dunder:
            keep = owner is cls and name not in SKIP_DUNDERS
        elif name.startswith("_"):
            keep = False
        else:
            keep = owner is cls or owner.__name__.startswith("_")
        if keep:
            yield name, vars(owner)[name]


def module_entries(mod, seen: set | None = None, shown: str | None = None) -> list[Entry]:
    """Documented functions, classes, methods and attributes of one module. Across calls sharing
    `seen`, each object and each docstring is used once (a re-export, or a docstring copied onto
    several objects, is documented under its first name only)."""
    seen = set() if seen is None else seen
    shown = shown or mod.__name__
    entries: list[Entry] = []

    def add(obj, qual: str, kind: str, sig_obj=None) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        doc = _own_doc(obj)
        if doc and doc not in seen:
            seen.add(doc)
            sig = _signature(sig_obj, qual) if sig_obj is not None else None
            entries.append(Entry(qual, shown, kind, sig, doc))

    for name in _public_names(mod):
        value = getattr(mod, name, None)
        qual = f"{shown}.{name}"
        if inspect.isclass(value):
            if id(value) in seen:
                continue
            add(value, qual, "class", value)
            for mname, raw in _class_members(value):
                fn = _callable_member(raw)
                if fn is not None:
                    add(fn, f"{qual}.{mname}", "method", fn)
                elif _is_attribute(raw) and not mname.startswith("_"):
                    add(raw, f"{qual}.{mname}", "attribute")
        elif inspect.isfunction(value) or inspect.isbuiltin(value):
            add(value, qual, "function", value)
        elif _own_instance_doc(value):
            add(value, qual, "object")  # e.g. typing.Optional: an instance with its own doc
    return entries


def collect_modules() -> list[ModuleDoc]:
    mods, seen = [], set()
    for name in stdlib_module_names():
        mod = sys.modules.get(name) or _quiet_import(name)
        if mod is not None:
            shown = DISPLAY_NAMES.get(name, name)
            mods.append(ModuleDoc(shown, _own_doc(mod), module_entries(mod, seen, shown)))
    return mods


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


# ---------------------------------------------------------------- writing


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
        raise RuntimeError(f"dataset is {total} bytes, over the {MAX_TOTAL_BYTES} byte budget")
    for name, text in texts.items():
        write_text(out_dir / f"{name}.jsonl", text)
    write_text(out_dir / "README.md", datasheet(splits, seed))
    return {name: len(items) for name, items in splits.items()}


# ---------------------------------------------------------------- command line


def add_arguments(parser) -> None:
    parser.add_argument("--out", default="data/chat", help="folder for train/heldout JSONL")
    parser.add_argument("--seed", type=int, default=SEED, help="seed for phrasing and order")


def run(args) -> int:
    counts = write(args.out, args.seed)
    summary = ", ".join(f"{k}: {v}" for k, v in counts.items())
    print(f"wrote {args.out}: {summary} conversations (Python {platform.python_version()})")
    return 0
