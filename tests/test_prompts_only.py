"""MT-bench questions and other prompts-only data: read as user turns, kept as prompts when the
target regenerates the answers and refused (no_assistant_turn) when it does not, answered turn
by turn, the second question after the target's own first answer."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import test_regenerate
from test_regenerate import TOY, Echo, reference_answer, stage

from eyrie.data.chat_tokens import answer_slots, tokenize_chat, unusable
from eyrie.data.dataset import DatasetError, prepare, read_chat
from eyrie.data.overlap import OverlapError, check_overlap
from eyrie.regenerate.hf import HFGenerator
from eyrie.regenerate.turns import assistant_turns, regenerate_conversations
from eyrie.target.load import load_tokenizer

toy = test_regenerate.toy  # the toy target and its tokenizer, loaded once

# question.jsonl's form (FastChat's MT-bench data): user turns only, some with a reference
QUESTIONS = [
    {"question_id": 81, "category": "writing",
     "turns": ["Compose a travel blog post about Hawaii.", "Rewrite it. Start each with A."]},
    {"question_id": 111, "category": "math",
     "turns": ["What is the area of a triangle with vertices (0, 0), (-1, 1), (3, 3)?",
               "What's the area of the circle circumscribing the triangle?"],
     "reference": ["Area is 3", "5pi"]},
]  # fmt: skip


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str | None) -> dict:
    return {"role": "assistant", "content": text}


def write(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mtbench_lines_are_two_user_turns_with_their_id_and_category(tmp_path):
    src = write(tmp_path / "question.jsonl", QUESTIONS)
    for fmt in ("auto", "mtbench"):
        convs, problems = read_chat(src, fmt=fmt, prompts_ok=True)
        assert problems == []
        assert [c.id for c in convs] == ["81", "111"]
        assert convs[0].messages == [user(q) for q in QUESTIONS[0]["turns"]]
        assert convs[1].messages == [user(q) for q in QUESTIONS[1]["turns"]]  # reference unused
        assert [c.extra for c in convs] == [{"category": "writing"}, {"category": "math"}]
    out = tmp_path / "heldout.jsonl"
    counts = prepare(src, out, tmp_path / "p.csv", split="heldout", regenerate=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["category"] for r in rows] == ["writing", "math"]
    assert rows[0]["messages"] == [user(q) for q in QUESTIONS[0]["turns"]]
    assert counts["prompts_only"] == 2 and counts["bad"] == 0


def test_mtbench_form_refuses_other_lines_and_bad_turns(tmp_path):
    rows = [
        {"id": "m", "messages": [user("hi"), assistant("hey")]},
        {"question_id": 90, "turns": ["ok", ""]},
        {"question_id": 91, "turns": ["ok", 7]},
        {"question_id": True, "turns": ["ok"]},
        {"question_id": 92, "turns": []},
    ]
    convs, problems = read_chat(write(tmp_path / "q.jsonl", rows), fmt="mtbench", prompts_ok=True)
    assert convs == []
    assert [(p.line, p.kind, p.sample_id) for p in problems] == [
        (1, "no_messages", "m"),
        (2, "bad_content", "90"),
        (3, "bad_content", "91"),
        (4, "bad_id", None),
        (5, "no_messages", "92"),
    ]
    assert "it has 'messages'; set dataset.format: auto" in problems[0].reason
    assert '"question_id" must be a non-empty string or an integer' in problems[3].reason


def test_prompts_only_data_is_bad_input_without_regeneration(tmp_path, capsys):
    src = write(tmp_path / "question.jsonl", QUESTIONS)
    convs, problems = read_chat(src)
    assert convs == [] and [p.kind for p in problems] == ["no_assistant_turn"] * 2
    assert "with regenerate.enabled: true the target would answer" in problems[0].reason
    # the split is empty: prepare stops the run there, naming the kind and the fix
    with pytest.raises(DatasetError) as err:
        prepare(src, tmp_path / "o.jsonl", tmp_path / "p.csv", split="heldout")
    msg = str(err.value)
    assert "dataset.heldout" in msg and "no usable conversation" in msg
    assert "no_assistant_turn: 2" in msg and "regenerate.enabled: true" in msg
    with pytest.raises(DatasetError, match=r"question\.jsonl:1: no_assistant_turn \(id 81\)"):
        prepare(src, tmp_path / "o.jsonl", tmp_path / "p.csv", on_bad="fail", split="heldout")


def test_with_regeneration_prompts_are_kept_and_empty_turns_still_refused(tmp_path):
    rows = [
        {"id": "q", "messages": [user("one"), user("two")]},
        {"id": "s", "messages": [{"role": "system", "content": "Be brief."}]},
        {"id": "a", "messages": [user("hi"), assistant("hey"), user("bye")]},
    ]
    src = write(tmp_path / "train.jsonl", rows)
    out = tmp_path / "train.out.jsonl"
    counts = prepare(src, out, tmp_path / "p.csv", split="train", regenerate=True)
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["q", "a"]
    assert counts["by_kind"] == {"no_assistant_turn": 1} and counts["prompts_only"] == 1
    _, problems = read_chat(src, prompts_ok=True)
    assert "no assistant turn and no user turn" in problems[0].reason


def test_every_user_turn_gets_an_answer_slot():
    sys_ = {"role": "system", "content": "s"}
    assert answer_slots([user("1"), user("2")]) == [
        user("1"), assistant(None), user("2"), assistant(None)
    ]  # fmt: skip
    trailing = [user("1"), assistant("x"), user("2")]
    assert answer_slots(trailing) == trailing + [assistant(None)]
    answered = [sys_, user("1"), sys_, assistant("y"), user("2"), assistant("z")]
    assert answer_slots(answered) == answered  # nothing added where every turn is answered
    assert answer_slots([user("1"), assistant("a"), assistant("b")])[1:] == [
        assistant("a"), assistant("b")
    ]  # fmt: skip


def test_prompt_checks_use_a_stand_in_answer_where_the_target_will_answer(tmp_path):
    tok = load_tokenizer(TOY)
    two = [user("What is a list?"), user("And a tuple?")]
    assert unusable(tok, two, 64)[0] == "empty_mask"  # as it is: nothing to learn from
    assert unusable(tok, two, 64, answers_later=True) is None  # as regeneration leaves it
    rows = [
        {"id": "ok", "messages": two},
        {"id": "long", "messages": [user("word " * 200), user("short")]},
    ]
    src = write(tmp_path / "train.jsonl", rows)
    counts = prepare(src, tmp_path / "o.jsonl", tmp_path / "p.csv", split="train", target=TOY,
                     max_tokens=64, regenerate=True)  # fmt: skip
    assert counts["written"] == 1 and counts["by_kind"] == {"prompt_too_long": 1}


def test_the_overlap_check_compares_prompts_only_splits(tmp_path):
    def split(name, rows):
        src = write(tmp_path / f"{name}.src.jsonl", rows)
        prepare(src, tmp_path / f"{name}.jsonl", tmp_path / f"{name}.csv", split=name,
                regenerate=True)  # fmt: skip
        return tmp_path / f"{name}.jsonl", str(src)

    train, train_src = split("train", [{"id": "t", "messages": [user("a"), user("b")]}])
    held, held_src = split("heldout", [{"question_id": 81, "turns": ["a", "b"]}])
    sources = {"train": train_src, "heldout": held_src}
    with pytest.raises(OverlapError, match="same prompts"):
        check_overlap(train, held, tmp_path / "o.json", sources=sources, key="prompts")
    other, other_src = split("heldout", [{"question_id": 82, "turns": ["a", "c"]}])
    report = check_overlap(train, other, tmp_path / "o.json", key="prompts",
                           sources={"train": train_src, "heldout": other_src})  # fmt: skip
    assert report["shared"] == 0


def test_the_target_answers_both_questions_in_order(toy):
    model, tok = toy
    records = [
        {"id": "81", "messages": [user(q) for q in QUESTIONS[0]["turns"]], "category": "writing"},
        {"id": "t", "messages": [user("What is a dict?"), assistant("A mapping."),
                                 user("And a set?")]},
    ]  # fmt: skip
    assert assistant_turns(records) == 4  # two questions each, so two answers each
    gen = HFGenerator(model, tok, max_new_tokens=12, temperature=0.0, batch_size=4)
    outcomes = regenerate_conversations(records, 0, gen, tok, max_prompt_tokens=900)
    for rec, out in zip(records, outcomes, strict=True):
        assert out.status == "generated" and out.kinds["answers"] == 2
        got = out.record["messages"]
        assert [m["role"] for m in got] == ["user", "assistant", "user", "assistant"]
        assert [got[0], got[2]] == [m for m in rec["messages"] if m["role"] == "user"]
        # each answer is the target's greedy answer to the conversation so far, its own
        # first answer included: the second question is asked after it
        assert got[1]["content"] == reference_answer(model, tok, got[:1], 12)
        assert got[3]["content"] == reference_answer(model, tok, got[:3], 12)
    assert outcomes[1].record["messages"][1]["content"] != "A mapping."
    assert outcomes[0].record["category"] == "writing"
    # what extraction then reads: both answers in the loss mask, the questions out of it
    mask = tokenize_chat(tok, outcomes[0].record["messages"], 512).loss_mask.tolist()
    runs = sum(m == 1 and (i == 0 or mask[i - 1] == 0) for i, m in enumerate(mask))
    assert runs == 2 and mask[0] == 0


def test_the_stage_counts_prompts_only_answers(tmp_path):
    tok = load_tokenizer(TOY)
    records = [{"id": str(q["question_id"]), "messages": [user(t) for t in q["turns"]]}
               for q in QUESTIONS]  # fmt: skip
    summary = stage(tmp_path, "o", records, lambda *a: (Echo(), tok, 1024))
    c = summary["counts"]
    assert (c["input"], c["generated"], c["skipped"]) == (2, 2, 0)
    assert c["kinds"]["answers"] == 4
    rows = [json.loads(x) for x in (tmp_path / "o" / "train.jsonl").read_text().splitlines()]
    assert all(len(r["messages"]) == 4 for r in rows)


@pytest.mark.slow
def test_a_run_on_mtbench_questions_regenerates_extracts_and_validates_them(tmp_path):
    """Held-out MT-bench questions through the workflow (tests/configs/small.yaml, regeneration
    on): prepared as prompts, checked for overlap, answered turn by turn, extracted and
    validated like any conversation, and decoded turn by turn by the transformers loop."""
    from slurm.workflow import CONFIGS, Workflow

    regen = {"enabled": True, "max_new_tokens": 12, "batch_size": 4, "chunk": 4, "device": "cpu"}
    wf = Workflow.scratch(
        tmp_path / "wd", CONFIGS / "small.yaml",
        # 256 tokens: room for both turns (no answer is asked past dataset.max_tokens)
        {"dataset": {"heldout": "data/question.jsonl", "max_tokens": 256}, "regenerate": regen,
         # one shard per split: 4 jobs fewer (sharding is tests/test_reruns.py's and
         # tests/test_slurm.py's; here it is what prompts-only data goes through)
         "extract": {"shards": 1}},
    )  # fmt: skip
    questions = [dict(q, question_id=q["question_id"] + k) for k in (0, 1) for q in QUESTIONS]
    write(wf.path("data/question.jsonl"), questions)
    wf.run("--cores", "2", "results/validate/summary.csv", "results/evaluate/speculate.json",
           timeout=900)  # fmt: skip

    def lines(rel: str) -> list[dict]:
        return [json.loads(x) for x in wf.path(rel).read_text().splitlines()]

    rows = lines("results/data/heldout.jsonl")
    assert [len(r["messages"]) for r in rows] == [2] * 4
    assert {r["category"] for r in rows} == {"writing", "math"}
    regenerated = lines("results/regen/heldout.jsonl")
    assert [[m["role"] for m in r["messages"]] for r in regenerated] == [
        ["user", "assistant", "user", "assistant"]
    ] * 4
    assert json.loads(wf.path("results/regen/overlap.json").read_text())["shared"] == 0
    table = pd.read_csv(wf.path("results/validate/summary.csv"), dtype={"shard": str})
    held = table[table["split"] == "heldout"]
    assert held["samples"].sum() == 4 and table["errors"].sum() == 0
    spec = json.loads(wf.path("results/evaluate/speculate.json").read_text())
    # evaluate.prompts 2: two questions of two turns each, 8 new tokens per turn
    assert (spec["prompts"], spec["turns"], spec["identical"]) == (2, 4, 2)
    assert [r["turns"] for r in spec["rows"]] == [2, 2]
