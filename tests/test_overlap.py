"""Held-out samples that are train samples: refused before extraction, naming both files and
the samples, unless dataset.allow_overlap counts them instead."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from slurm.workflow import CONFIGS, Workflow

from eyrie.data.dataset import prepare

DATA = Path(__file__).resolve().parents[1] / "data" / "chat"


def _lines(path: Path, n: int) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()[:n]]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _prepared(tmp_path: Path, train: Path, heldout: Path) -> tuple[Path, Path, dict]:
    out = tmp_path / "prepared"
    for split, src in (("train", train), ("heldout", heldout)):
        prepare(src, out / f"{split}.jsonl", out / f"{split}.problems.csv", split=split)
    sources = {"train": str(train), "heldout": str(heldout)}
    return out / "train.jsonl", out / "heldout.jsonl", sources


def _check(train: Path, heldout: Path, sources: dict, out: Path, **kw) -> dict:
    from eyrie.data.overlap import check_overlap

    return check_overlap(train, heldout, out, sources=sources, **kw)


def test_the_same_file_for_both_splits_is_refused(tmp_path):
    from eyrie.data.overlap import OverlapError

    src = _write(tmp_path / "chat.jsonl", _lines(DATA / "train.jsonl", 6))
    train, held, sources = _prepared(tmp_path, src, src)
    out = tmp_path / "overlap.json"
    with pytest.raises(OverlapError) as err:
        _check(train, held, sources, out)
    text = str(err.value)
    assert text.startswith(f"dataset.train and dataset.heldout are the same file, {src}: ")
    assert "6 of the 6 held-out samples are train samples (6 with the same id, 6 with" in text
    first = _lines(src, 1)[0]["id"]
    assert f'"{first}" ({src}:1) = "{first}" ({src}:1), same id and conversation' in text
    assert "dataset.allow_overlap: true" in text
    assert not out.exists()


def test_the_same_conversations_under_other_ids_are_refused(tmp_path):
    from eyrie.data.overlap import OverlapError

    rows = _lines(DATA / "train.jsonl", 5)
    train_src = _write(tmp_path / "train.jsonl", rows)
    # other ids, ShareGPT form, surrounding whitespace: still the same conversations
    held_rows = (
        [_lines(DATA / "heldout.jsonl", 1)[0]]
        + [
            {
                "id": f"other-{i}",
                "conversations": [
                    {
                        "from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]),
                        "value": f"  {m['content']}\n",
                    }
                    for m in r["messages"]
                ],
            }  # fmt: skip
            for i, r in enumerate(rows[2:4])
        ]
    )
    held_src = _write(tmp_path / "heldout.jsonl", held_rows)
    train, held, sources = _prepared(tmp_path, train_src, held_src)
    with pytest.raises(OverlapError) as err:
        _check(train, held, sources, tmp_path / "overlap.json")
    text = str(err.value)
    assert text.startswith(f"dataset.heldout ({held_src}) and dataset.train ({train_src}) overlap")
    assert "2 of the 3 held-out samples are train samples (0 with the same id, 2 with" in text
    assert f'"other-0" ({held_src}:2) = "{rows[2]["id"]}" ({train_src}:3), same conversation' in (
        text
    )
    assert f'"other-1" ({held_src}:3) = "{rows[3]["id"]}" ({train_src}:4)' in text


def test_ids_shared_with_other_conversations_are_refused_as_ids(tmp_path):
    train_rows = _lines(DATA / "train.jsonl", 3)
    held_rows = [{**r, "id": t["id"]} for r, t in zip(_lines(DATA / "heldout.jsonl", 2),
                                                       train_rows[1:], strict=True)]  # fmt: skip
    train_src = _write(tmp_path / "train.jsonl", train_rows)
    held_src = _write(tmp_path / "heldout.jsonl", held_rows)
    train, held, sources = _prepared(tmp_path, train_src, held_src)
    from eyrie.data.overlap import OverlapError

    with pytest.raises(OverlapError) as err:
        _check(train, held, sources, tmp_path / "overlap.json")
    text = str(err.value)
    assert "2 of the 2 held-out samples have the id of a train sample, with another conv" in text
    sid = train_rows[1]["id"]
    assert f'"{sid}" ({held_src}:1) = "{sid}" ({train_src}:2), same id;' in text
    assert "Give the held-out samples ids of their own" in text


def test_allow_overlap_only_counts(tmp_path):
    src = _write(tmp_path / "chat.jsonl", _lines(DATA / "train.jsonl", 4))
    train, held, sources = _prepared(tmp_path, src, src)
    out = tmp_path / "overlap.json"
    report = _check(train, held, sources, out, allow=True)
    assert json.loads(out.read_text()) == report
    assert (report["shared"], report["shared_by_id"], report["allowed"]) == (4, 4, True)
    assert report["first"][0]["heldout"] == report["first"][0]["train"]


def test_distinct_splits_pass(tmp_path):
    train_src = _write(tmp_path / "train.jsonl", _lines(DATA / "train.jsonl", 20))
    held_src = _write(tmp_path / "heldout.jsonl", _lines(DATA / "heldout.jsonl", 10))
    train, held, sources = _prepared(tmp_path, train_src, held_src)
    report = _check(train, held, sources, tmp_path / "overlap.json")
    assert (report["shared"], report["heldout"]["samples"]) == (0, 10)


def test_with_regeneration_the_same_prompts_are_the_same_sample(tmp_path):
    """Regenerated answers are the target's answers to the prompts: a held-out conversation
    whose prompts are a train conversation's gets the same answers (greedy) or answers from
    the same distribution (sampling), so the prompts alone decide."""
    from eyrie.data.overlap import OverlapError

    row = _lines(DATA / "train.jsonl", 1)[0]
    other = {
        "id": "new-answer",
        "messages": [
            {**m, "content": "a different answer"} if m["role"] == "assistant" else m
            for m in row["messages"]
        ],
    }
    train_src = _write(tmp_path / "train.jsonl", [row])
    held_src = _write(tmp_path / "heldout.jsonl", [other])
    train, held, sources = _prepared(tmp_path, train_src, held_src)
    out = tmp_path / "overlap.json"
    assert _check(train, held, sources, out)["shared"] == 0  # other answers: not training data
    with pytest.raises(OverlapError, match="1 of the 1 held-out samples after regeneration") as e:
        _check(train, held, sources, out, key="prompts", regenerated=True)
    assert "same prompts (system and user turns); the target's answers" in str(e.value)


def _store(path: Path, ids: list[str]) -> dict:
    from eyrie.store.shard import ShardWriter

    with ShardWriter(path, hidden_size=4, aux_layer_ids=[0], provenance={}) as w:
        for sid in ids:
            T = 3
            w.append(sid, torch.arange(T), torch.ones(T, dtype=torch.bool),
                     torch.ones(T, 1, 4), torch.ones(T, 4))  # fmt: skip
        w.finish()
    return {"store": str(path), "split": path.parent.name, "shard": path.stem}


def test_validation_counts_ids_shared_by_the_splits_unless_allowed(tmp_path):
    from eyrie.validate.summary import cross_shard

    stores = [
        _store(tmp_path / "train" / "000.zarr", ["a", "b"]),
        _store(tmp_path / "train" / "001.zarr", ["c", "b"]),  # b: twice in train
        _store(tmp_path / "heldout" / "000.zarr", ["a", "x"]),  # a: in both splits
    ]

    def counts(across: bool) -> Counter:
        reports = [dict(s) for s in stores]
        cross_shard(reports, across_splits=across)
        return Counter((r["split"], p["sample_id"]) for r in reports for p in r.get("problems", []))

    assert counts(True) == Counter({("train", "b"): 1, ("heldout", "a"): 1})
    assert counts(False) == Counter({("train", "b"): 1})


@pytest.fixture
def same_file(tmp_path) -> Workflow:
    return Workflow.scratch(
        tmp_path / "wd", CONFIGS / "small.yaml", {"dataset": {"heldout": "data/chat/train.jsonl"}}
    )


def test_a_run_with_the_same_file_stops_before_extraction(same_file):
    wf = same_file
    plan = {j.rule: j for j in wf.plan()}
    assert "results/data/overlap.json" in plan["extract"].reason  # extraction waits for it
    log = wf.run("--cores", "1", "results/data/overlap.json", check=False)
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert errors and errors[0].startswith(
        "error: dataset.train and dataset.heldout are the same file, data/chat/train.jsonl: 4 of "
        "the 4 held-out samples are train samples"
    ), log[-3000:]
    assert "Error in rule check_overlap" in log
    assert not wf.path("results/data/overlap.json").exists()

    allowed = wf.with_config("allow", {"dataset": {"allow_overlap": True}})
    allowed.run("--cores", "1", "results/data/overlap.json")
    report = json.loads(wf.path("results/data/overlap.json").read_text())
    assert (report["shared"], report["allowed"]) == (4, True)


def test_with_regeneration_both_the_prepared_and_the_regenerated_splits_are_checked(same_file):
    wf = same_file.with_config("regen", {"regenerate": {"enabled": True}})
    plan = wf.plan()
    checks = {j.wildcards["splits"]: j for j in plan if j.rule == "check_overlap"}
    assert set(checks) == {"data", "regen"}
    assert "results/regen/train.jsonl" in checks["regen"].reason
    assert all("results/data/overlap.json" in j.reason for j in plan if j.rule == "regenerate")
    assert all("results/regen/overlap.json" in j.reason for j in plan if j.rule == "extract")


def test_a_new_heldout_file_redoes_the_heldout_stores_only(tmp_path):
    """The overlap check gates extraction without being its data: rechecked after the held-out
    file changed, it does not redo the train split's stores."""
    wf = Workflow.scratch(tmp_path / "wd", CONFIGS / "small.yaml")
    wf.pretend_finished()
    assert wf.plan() == []
    rows = wf.path("data/chat/heldout.jsonl").read_text().splitlines()
    wf.path("data/chat/other.jsonl").write_text("\n".join(rows[10:20]) + "\n")
    plan = wf.with_config("other", {"dataset": {"heldout": "data/chat/other.jsonl"}}).plan()
    rules = Counter(j.rule for j in plan)
    assert rules["check_overlap"] == 1 and rules["prepare_dataset"] == 1
    assert {j.wildcards["split"] for j in plan if j.rule == "extract"} == {"heldout"}
    assert rules["extract"] == 2 and "draft_vocab" not in rules


@pytest.mark.parametrize("reader", ["eyrie.data.overlap", "eyrie.regenerate.stage"])
def test_a_split_whose_strings_hold_line_separators_reads_back_whole(tmp_path, reader):
    """JSON writes U+2028, U+2029 and U+0085 unescaped (ensure_ascii=False), and ShareGPT's
    answers hold them; each is still one record per "\\n"-ended line."""
    import importlib

    rows = [{"id": f"s{i}", "messages": [{"role": "user", "content": f"a{sep}b"}]}
            for i, sep in enumerate(("\u2028", "\u2029", "\x85", "\x1c", "plain"))]  # fmt: skip
    path = tmp_path / "split.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    assert importlib.import_module(reader).read_records(path) == rows
