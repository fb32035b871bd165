"""ShareGPT's later parts open with the assistant: dataset.leading_assistant drops that turn
(as FastChat/EAGLE do) or makes the conversation a bad line."""

import json

import pytest

from eyrie.data.dataset import DatasetError, prepare, read_chat
from eyrie.data.records import drop_leading_assistant

TOY = "models/toy-llama"


def sharegpt(path, records):
    path.write_text(json.dumps(records))
    return path


def turn(who, text):
    return {"from": who, "value": text}


CONTINUED = {"id": "part-2", "conversations": [turn("gpt", "...and that is the end."),
                                              turn("human", "Thanks. Why?"),
                                              turn("gpt", "Because.")]}  # fmt: skip
WHOLE = {"id": "whole", "conversations": [turn("human", "Hi"), turn("gpt", "Hello")]}
ONLY_ANSWER = {"id": "lonely", "conversations": [turn("gpt", "an answer to nothing")]}


def test_only_the_turns_before_the_first_user_turn_go():
    sys_ = {"role": "system", "content": "be brief"}
    a, u = {"role": "assistant", "content": "a"}, {"role": "user", "content": "u"}
    assert drop_leading_assistant([sys_, a, a, u, a]) == ([sys_, u, a], 2)
    assert drop_leading_assistant([u, a, u, a]) == ([u, a, u, a], 0)
    assert drop_leading_assistant([a]) == ([], 1)


def test_drop_keeps_the_rest_and_says_so(tmp_path):
    src = sharegpt(tmp_path / "sg.json", [CONTINUED, WHOLE, ONLY_ANSWER])
    out, csv = tmp_path / "train.jsonl", tmp_path / "p.csv"
    counts = prepare(src, out, csv, split="train", target=TOY, max_tokens=256)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["part-2", "whole"]
    assert rows[0]["messages"][0] == {"role": "user", "content": "Thanks. Why?"}
    assert rows[0]["dropped_leading_turns"] == 1 and "dropped_leading_turns" not in rows[1]
    assert counts["leading_assistant_dropped"] == 1
    # the record with nothing but an answer is still a bad line, named as such
    assert counts["by_kind"] == {"no_assistant_turn": 1}


def test_bad_keeps_the_template_refusal(tmp_path):
    src = sharegpt(tmp_path / "sg.json", [CONTINUED, WHOLE])
    out, csv = tmp_path / "train.jsonl", tmp_path / "p.csv"
    counts = prepare(src, out, csv, split="train", target=TOY, max_tokens=256,
                     leading_assistant="bad")  # fmt: skip
    assert counts["by_kind"] == {"assistant_first": 1} and counts["good"] == 1
    assert "part-2" in csv.read_text()


def test_an_unknown_choice_names_the_key(tmp_path):
    src = sharegpt(tmp_path / "sg.json", [WHOLE])
    with pytest.raises(DatasetError, match="dataset.leading_assistant"):
        read_chat(src, leading_assistant="keep")


def test_the_cli_counts_what_it_dropped(tmp_path, capsys):
    from eyrie.cli.main import main

    src = sharegpt(tmp_path / "sg.json", [CONTINUED, WHOLE])
    assert main(["dataset", str(src)]) == 0
    assert (
        capsys.readouterr()
        .out.rstrip()
        .endswith("2 good, 0 bad; 1 opened with an assistant turn, dropped")
    )
    assert main(["dataset", str(src), "--leading-assistant", "bad"]) == 0
    assert "dropped" not in capsys.readouterr().out
