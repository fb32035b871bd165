"""Chat dataset reading, problem accounting, prepare's outputs, and the shipped dataset."""

from __future__ import annotations

import hashlib
import json
import platform
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from eyrie.cli.main import main
from eyrie.data import chat_corpus
from eyrie.data.dataset import DatasetError, prepare, read_chat

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "data" / "chat"

# The same two conversations, written by hand in each form.
EXPECTED = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
    ],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Goodbye."},
    ],
]
MESSAGES_LINES = [
    {"id": "a", "messages": EXPECTED[0]},
    {"id": "b", "messages": EXPECTED[1]},
]
SHAREGPT_LINES = [
    {
        "id": "a",
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "What is 2 + 2?"},
            {"from": "gpt", "value": "4"},
        ],
    },
    {
        "id": "b",
        "conversations": [
            {"from": "user", "value": "Hi"},
            {"from": "chatgpt", "value": "Hello."},
            {"from": "human", "value": "Bye"},
            {"from": "bing", "value": "Goodbye."},
        ],
    },
]


def write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("fmt", ["auto", None])
def test_both_forms_read_to_the_same_conversations(tmp_path, fmt):
    m = write_lines(tmp_path / "m.jsonl", MESSAGES_LINES)
    s = write_lines(tmp_path / "s.jsonl", SHAREGPT_LINES)
    m_convs, m_probs = read_chat(m, fmt=fmt or "messages")
    s_convs, s_probs = read_chat(s, fmt=fmt or "sharegpt")
    assert m_probs == [] and s_probs == []
    assert [c.messages for c in m_convs] == EXPECTED
    assert [c.messages for c in s_convs] == EXPECTED
    assert [(c.id, c.line) for c in s_convs] == [("a", 1), ("b", 2)]


def test_openai_content_parts_are_joined_and_other_parts_are_bad_lines(tmp_path):
    def text(t):
        return {"type": "text", "text": t}

    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    lines = [
        {"id": "parts", "messages": [
            {"role": "user", "content": [text("What is"), text("2 + 2?")]},
            {"role": "assistant", "content": [text("4")]},
        ]},
        {"id": "image", "messages": [
            {"role": "user", "content": [text("What is this?"), image]},
            {"role": "assistant", "content": "A cat."},
        ]},
        {"id": "untyped", "messages": [
            {"role": "user", "content": ["Hi"]}, {"role": "assistant", "content": "Hello."},
        ]},
        {"id": "empty", "messages": [
            {"role": "user", "content": []}, {"role": "assistant", "content": "Hello."},
        ]},
    ]  # fmt: skip
    convs, problems = read_chat(write_lines(tmp_path / "p.jsonl", lines))
    assert [c.messages for c in convs] == [
        [{"role": "user", "content": "What is\n2 + 2?"}, {"role": "assistant", "content": "4"}]
    ]
    assert [(p.line, p.kind, p.sample_id) for p in problems] == [
        (2, "bad_content", "image"),
        (3, "bad_content", "untyped"),
        (4, "bad_content", "empty"),
    ]
    assert "turn 0 (user) content part 1 is of type 'image_url'; only text parts" in (
        problems[0].reason
    )
    assert "drop that part, or the line" in problems[0].reason
    assert "content part 0 is a str, not a typed part" in problems[1].reason
    assert "content is an empty list of parts" in problems[2].reason


def test_auto_decides_per_line_and_explicit_format_refuses_the_other(tmp_path):
    mixed = write_lines(tmp_path / "mixed.jsonl", [MESSAGES_LINES[0], SHAREGPT_LINES[1]])
    convs, problems = read_chat(mixed)
    assert [c.messages for c in convs] == EXPECTED and problems == []

    convs, problems = read_chat(mixed, fmt="messages")
    assert [c.id for c in convs] == ["a"]
    assert [(p.line, p.kind) for p in problems] == [(2, "no_messages")]
    assert "dataset.format: auto" in problems[0].reason


def test_lines_without_id_are_named_by_file_and_line(tmp_path):
    lines = [{"messages": EXPECTED[0]}, {"id": 7, "messages": EXPECTED[1]}]
    convs, _ = read_chat(write_lines(tmp_path / "chats.jsonl", lines))
    assert [c.id for c in convs] == ["chats-1", "7"]


def bad_file(tmp_path: Path) -> tuple[Path, dict[int, str]]:
    """A file with one line of every problem kind; returns it and {line: kind}."""
    ok = {"role": "assistant", "content": "fine"}
    user = {"role": "user", "content": "q"}
    rows: list[tuple[bytes, str | None]] = [
        (json.dumps({"id": "good", "messages": [user, ok]}).encode(), None),
        (b"{not json", "malformed_json"),
        ('{"id": "x", "messages": "caf\u00e9"}'.encode("latin-1"), "not_utf8"),
        (b"[1, 2, 3]", "not_an_object"),
        (json.dumps({"id": "nm", "text": "hello"}).encode(), "no_messages"),
        (json.dumps({"id": "empty", "messages": []}).encode(), "no_messages"),
        (b"", "blank_line"),
        (
            json.dumps({"id": "r", "messages": [{"role": "tool", "content": "x"}, ok]}).encode(),
            "unknown_role",
        ),
        (
            json.dumps({"id": "sg", "conversations": [{"from": "robot", "value": "x"}]}).encode(),
            "unknown_role",
        ),
        (
            json.dumps({"id": "c1", "messages": [{"role": "user", "content": ""}, ok]}).encode(),
            "bad_content",
        ),
        (
            json.dumps({"id": "c2", "messages": [user, {"role": "assistant"}]}).encode(),
            "bad_content",
        ),
        (
            json.dumps(
                {"id": "c3", "messages": [user, {"role": "assistant", "content": [1]}]}
            ).encode(),
            "bad_content",
        ),
        (json.dumps({"id": "na", "messages": [user]}).encode(), "no_assistant_turn"),
        (json.dumps({"id": "good", "messages": [user, ok]}).encode(), "duplicate_id"),
        (json.dumps({"id": ["x"], "messages": [user, ok]}).encode(), "bad_id"),
        (json.dumps({"id": "last", "messages": [user, ok]}).encode(), None),
    ]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(raw for raw, _ in rows) + b"\n")
    expected = {i: kind for i, (_, kind) in enumerate(rows, start=1) if kind}
    return path, expected


def test_every_bad_line_is_a_problem_with_its_line_and_reason(tmp_path):
    path, expected = bad_file(tmp_path)
    convs, problems = read_chat(path)
    assert [(c.id, c.line) for c in convs] == [("good", 1), ("last", len(expected) + 2)]
    assert {p.line: p.kind for p in problems} == expected
    assert len(problems) == len(expected)  # one problem per line
    by_kind = {p.kind: p for p in problems}  # the last line of each kind
    by_line = {p.line: p for p in problems}
    assert all(p.path == str(path) and p.reason for p in problems)
    assert "0xe9" in by_kind["not_utf8"].reason  # the offending latin-1 byte
    assert "line 1" in by_kind["duplicate_id"].reason
    assert by_kind["duplicate_id"].sample_id == "good"
    assert "'tool'" in by_line[8].reason and "'robot'" in by_line[9].reason
    assert by_kind["no_assistant_turn"].sample_id == "na"
    assert not by_kind["blank_line"].is_bad
    assert sum(p.is_bad for p in problems) == len(expected) - 1


def test_fail_policy_raises_naming_file_line_kind_and_fix(tmp_path):
    path, expected = bad_file(tmp_path)
    first = min(expected)
    with pytest.raises(DatasetError) as err:
        read_chat(path, on_bad="fail")
    msg = str(err.value)
    assert f"{path}:{first}: {expected[first]}" in msg
    assert "dataset.on_bad_input: skip" in msg


def test_fail_policy_passes_blank_lines(tmp_path):
    path = write_lines(tmp_path / "ok.jsonl", MESSAGES_LINES)
    path.write_text(path.read_text() + "\n")
    convs, problems = read_chat(path, on_bad="fail")
    assert len(convs) == 2 and [p.kind for p in problems] == ["blank_line"]


def test_missing_file_and_bad_options_name_the_config_key(tmp_path):
    with pytest.raises(DatasetError, match=r"does not exist; set dataset\.heldout"):
        prepare(tmp_path / "nope.jsonl", tmp_path / "o.jsonl", tmp_path / "p.csv", split="heldout")
    path = write_lines(tmp_path / "m.jsonl", MESSAGES_LINES)
    with pytest.raises(DatasetError, match="dataset.format"):
        read_chat(path, fmt="jsonl")
    with pytest.raises(DatasetError, match="dataset.on_bad_input"):
        read_chat(path, on_bad="ignore")


def test_prepare_writes_normalized_messages_and_problems(tmp_path, capsys):
    path, expected = bad_file(tmp_path)
    extra = [json.dumps(x).encode() for x in SHAREGPT_LINES]
    path.write_bytes(path.read_bytes() + b"\n".join(extra) + b"\n")
    out, csv = tmp_path / "out" / "train.jsonl", tmp_path / "out" / "train.problems.csv"

    counts = prepare(path, out, csv, max_samples=3, split="train")

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["good", "last", "a"]  # first 3 good, file order
    assert rows[2]["messages"] == EXPECTED[0]  # ShareGPT normalized to messages
    assert all(set(r) == {"id", "messages", "source"} for r in rows)
    assert [r["source"].rsplit(":", 1)[1] for r in rows][:2] == ["1", str(len(expected) + 2)]
    table = pd.read_csv(csv)
    assert list(table.columns) == [
        "path", "line", "record", "offset", "kind", "reason", "sample_id"
    ]  # fmt: skip
    assert dict(zip(table["line"], table["kind"], strict=True)) == expected
    assert (table["record"] == table["line"]).all()  # JSON Lines: a record is a line
    lines = path.read_bytes().split(b"\n")
    starts = [sum(len(x) + 1 for x in lines[: n - 1]) for n in table["line"]]
    assert list(table["offset"]) == starts  # the byte each line starts at
    # reading stopped at the third good conversation: "b", after it, was not read
    assert counts["good"] == 3 and counts["written"] == 3 and not counts["read_to_end"]
    assert counts["bad"] == len(expected) - 1 and counts["blank_lines"] == 1
    assert counts["by_kind"]["no_messages"] == 2
    printed = capsys.readouterr().out
    assert "3 good, 13 bad" in printed and "max_samples (3) reached" in printed
    assert sorted(p.name for p in out.parent.iterdir()) == ["train.jsonl", "train.problems.csv"]


def test_prepare_writes_a_header_for_no_problems(tmp_path):
    src = write_lines(tmp_path / "m.jsonl", MESSAGES_LINES)
    counts = prepare(src, tmp_path / "o.jsonl", tmp_path / "p.csv")
    assert (tmp_path / "p.csv").read_text().strip() == (
        "path,line,record,offset,kind,reason,sample_id"
    )
    assert counts["written"] == 2 and counts["bad"] == 0


def test_cli_lists_problems_and_fails_only_under_fail(tmp_path, capsys):
    path, expected = bad_file(tmp_path)
    assert main(["dataset", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}:2: malformed_json" in out
    assert main(["dataset", str(path), "--on-bad-input", "fail"]) == 1
    assert main(["dataset", str(write_lines(tmp_path / "m.jsonl", SHAREGPT_LINES))]) == 0
    assert main(["dataset", str(tmp_path / "missing.jsonl")]) == 1


SURROGATE_LINES = [
    '{"id": "ok1", "conversations": [{"from": "human", "value": "hi"}, '
    '{"from": "gpt", "value": "hello \\ud83d\\ude00"}]}',  # a whole pair: a good line
    '{"id": "lone", "conversations": [{"from": "human", "value": "emoji \\ud83d please"}, '
    '{"from": "gpt", "value": "ok"}]}',
    '{"id": "lo\\udc00ne", "messages": [{"role": "user", "content": "q"}, '
    '{"role": "assistant", "content": "a"}]}',
    '{"id": "ok2", "messages": [{"role": "user", "content": "q"}, '
    '{"role": "assistant", "content": "a"}]}',
]


def test_a_lone_surrogate_escape_is_a_bad_line_under_skip(tmp_path, capsys):
    src = tmp_path / "sur.jsonl"
    src.write_text("\n".join(SURROGATE_LINES) + "\n", encoding="utf-8")
    assert main(["dataset", str(src)]) == 0
    out = capsys.readouterr().out
    assert f'{src}:2: lone_surrogate (id lone): turn 0 (user) "value"' in out
    assert "\\ud83d at character 7" in out
    assert f"{src}:3: lone_surrogate" in out and "2 good, 2 bad" in out
    dst, csv = tmp_path / "o" / "train.jsonl", tmp_path / "o" / "train.problems.csv"
    counts = prepare(src, dst, csv, on_bad="skip", split="train")
    assert counts["good"] == 2 and counts["by_kind"] == {"lone_surrogate": 2}
    assert [json.loads(x)["id"] for x in dst.read_text(encoding="utf-8").splitlines()] == [
        "ok1",
        "ok2",
    ]
    table = pd.read_csv(csv)
    assert list(zip(table["line"], table["kind"], strict=True)) == [
        (2, "lone_surrogate"),
        (3, "lone_surrogate"),
    ]


def test_a_lone_surrogate_escape_stops_the_fail_policy_naming_the_line(tmp_path):
    src = tmp_path / "sur.jsonl"
    src.write_text("\n".join(SURROGATE_LINES) + "\n", encoding="utf-8")
    dst, csv = tmp_path / "o" / "train.jsonl", tmp_path / "o" / "train.problems.csv"
    with pytest.raises(DatasetError, match=rf"{re.escape(str(src))}:2: lone_surrogate"):
        prepare(src, dst, csv, on_bad="fail", split="train")
    assert main(["dataset", str(src), "--on-bad-input", "fail"]) == 1


# ---------------------------------------------------------------- the shipped dataset


def test_shipped_dataset_is_clean_and_splits_are_disjoint():
    ids = {}
    for split in ("train", "heldout"):
        convs, problems = read_chat(SHIPPED / f"{split}.jsonl", fmt="messages", on_bad="fail")
        assert problems == []
        assert all(any(m["role"] == "assistant" for m in c.messages) for c in convs)
        ids[split] = {c.id for c in convs}
    assert len(ids["train"]) + len(ids["heldout"]) >= 5000
    assert not ids["train"] & ids["heldout"]
    # the split is a pure function of the id: recompute it independently
    for split, members in ids.items():
        for cid in members:
            bucket = int(hashlib.sha256(cid.encode()).hexdigest()[:8], 16) % 100
            assert (bucket < 8) == (split == "heldout"), cid
    assert 0.04 < len(ids["heldout"]) / len(ids["train"] | ids["heldout"]) < 0.12


def test_shipped_datasheet_counts_match_the_files():
    readme = (SHIPPED / "README.md").read_text()
    for split in ("train", "heldout"):
        n = sum(1 for _ in open(SHIPPED / f"{split}.jsonl", encoding="utf-8"))
        assert re.search(rf"^\| {split} \| {n} \|", readme, re.M), split
    assert "Python Software Foundation License" in readme
    assert "eyrie make-dataset --out data/chat" in readme


def test_trim_keeps_whole_paragraphs_within_the_limit():
    paras = [f"Paragraph {i} " + "x" * 80 for i in range(30)]
    text = "\n\n".join(paras)
    cut = chat_corpus.trim(text, 300)
    assert len(cut) <= 300 and text.startswith(cut)
    assert cut.split("\n\n") == paras[: len(cut.split("\n\n"))]
    assert chat_corpus.trim("Intro:\n\n" + "y" * 500, 300) == "Intro:"  # lone paragraph kept
    assert chat_corpus.trim("short", 300) == "short"


def test_signatures_do_not_depend_on_a_virtualenv(tmp_path):
    """sysconfig's default scheme is "venv" inside a virtualenv: the text must not show it."""
    probe = (
        "import sys, sysconfig; from eyrie.data import stdlib_docs; "
        "print(sys.prefix != sys.base_prefix, "
        "stdlib_docs.signature(sysconfig.get_paths, 'sysconfig.get_paths'))"
    )
    venv = [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")]
    subprocess.run(venv, check=True)
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    shown = {}
    outside = getattr(sys, "_base_executable", sys.executable)  # the base Python, even in a venv
    for python in (outside, str(tmp_path / "v" / "bin" / "python")):
        out = subprocess.run(
            [python, "-c", probe], check=True, capture_output=True, text=True, env=env, cwd=tmp_path
        ).stdout.split(" ", 1)
        shown[out[0]] = out[1].strip()
    assert set(shown) == {"True", "False"}, shown  # one run inside a venv, one outside
    assert (
        shown["True"]
        == shown["False"]
        == ("sysconfig.get_paths(scheme=get_default_scheme(), vars=None, expand=True)")
    )


def test_rebuild_reproduces_the_shipped_files(tmp_path):
    readme = (SHIPPED / "README.md").read_text()
    recorded = re.search(r"- Python: (\S+) \((\w+), (\w+)\)", readme)
    here = (platform.python_version(), platform.python_implementation(), sys.platform)
    if recorded is None or recorded.groups() != here:
        pytest.skip(f"the shipped dataset was built on {recorded and recorded.groups()}")
    cmd = [sys.executable, "-m", "eyrie.cli.main", "make-dataset", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, cwd=tmp_path, capture_output=True, timeout=120)
    for name in ("train.jsonl", "heldout.jsonl", "README.md"):
        assert (tmp_path / name).read_bytes() == (SHIPPED / name).read_bytes(), name
