"""The regenerate stage: the target's own answers, turn by turn, resumable and counted.

Greedy answers are checked against an independent reference (a loop of full forward passes of
the same transformers model, no cache, no batching); resume, counts and locking use a cheap
stand-in generator with the real toy tokenizer.
"""

from __future__ import annotations

import fcntl
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from fake_sglang import fake_server

from eyrie.data.chat_tokens import render
from eyrie.regenerate.hf import Answer, HFGenerator, stop_ids
from eyrie.regenerate.stage import RegenerateError, SplitJob, read_work, regenerate_split
from eyrie.regenerate.turns import regenerate_conversations
from eyrie.target.load import load_model, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "models" / "toy-llama"
SETTINGS = {
    "backend": "hf",
    "temperature": 0.0,
    "max_new_tokens": 16,
    "batch_size": 3,
    "chunk": 4,
    "seed": 0,
    "device": "cpu",
}


def shipped(n: int, multi_turn: bool = False) -> list[dict]:
    out = []
    for line in (ROOT / "data" / "chat" / "train.jsonl").read_text().splitlines():
        rec = json.loads(line)
        turns = sum(m["role"] == "assistant" for m in rec["messages"])
        if (turns > 1) == multi_turn:
            out.append(rec)
        if len(out) == n:
            return out
    raise AssertionError("the shipped data has too few such conversations")


@pytest.fixture(scope="module")
def toy():
    torch.manual_seed(0)
    model, _ = load_model(TOY, torch.device("cpu"))
    return model, load_tokenizer(TOY)


@torch.no_grad()
def reference_answer(model, tokenizer, messages, n: int) -> str:
    """Greedy, one full forward pass per token: no KV cache, no padding, no batch."""
    prompt = render(tokenizer, messages, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    stops, new = stop_ids(tokenizer, model), []
    for _ in range(n):
        nxt = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
        if nxt in stops:
            break
        new.append(nxt)
    return tokenizer.decode(new, skip_special_tokens=True).strip()


def test_greedy_answers_match_full_forward_passes_turn_by_turn(toy):
    model, tok = toy
    records = shipped(4) + shipped(2, multi_turn=True)
    gen = HFGenerator(model, tok, max_new_tokens=16, temperature=0.0, batch_size=4)
    outcomes = regenerate_conversations(records, 0, gen, tok, max_prompt_tokens=900)
    for rec, out in zip(records, outcomes, strict=True):
        assert out.status == "generated"
        got = out.record["messages"]
        assert [m["role"] for m in got] == [m["role"] for m in rec["messages"]][: len(got)]
        for i, msg in enumerate(got):
            if msg["role"] == "assistant":  # against the target's own earlier answers
                assert msg["content"] == reference_answer(model, tok, got[:i], 16)
            else:
                assert msg == rec["messages"][i]
    assert sum(len(o.record["messages"]) > 2 for o in outcomes) == 2  # multi-turn kept


class Echo:
    """Answers with the prompt's last tokens (the turn's own question, so each answer differs);
    answer number `empty_at` is empty, `cut_at` runs to the limit, `fail_at` raises."""

    def __init__(self, empty_at=(), cut_at=(), fail_at=None):
        self.calls, self.n = 0, 0
        self.empty_at, self.cut_at, self.fail_at = set(empty_at), set(cut_at), fail_at

    def generate(self, prompts):
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            raise RuntimeError("out of memory (stand-in)")
        out = []
        for p in prompts:
            self.n += 1
            ids = [] if self.n in self.empty_at else [t for t in p[-6:] if t > 2]
            out.append(Answer(ids, stopped=self.n not in self.cut_at))
        return out


def stage(tmp_path, name, records, factory, settings=SETTINGS):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / name
    job = SplitJob(data=data, target=TOY, out=out / "train.jsonl", split="train")
    summary = regenerate_split(job, settings, progress=False, generator_factory=factory)
    assert json.loads((out / "train.summary.json").read_text()) == summary
    return summary


def test_a_killed_run_resumes_to_what_an_uninterrupted_run_writes(tmp_path):
    tok = load_tokenizer(TOY)
    records = shipped(7) + shipped(3, multi_turn=True)
    whole = stage(tmp_path, "whole", records, lambda *a: (Echo(), tok, 1024))
    with pytest.raises(RuntimeError, match="out of memory"):  # dies in chunk 2 (of 3)
        stage(tmp_path, "cut", records, lambda *a: (Echo(fail_at=3), tok, 1024))
    work = tmp_path / "cut" / ".work" / "train.jsonl"
    assert len(read_work(work)) == 4  # chunk 1 kept; nothing of the failed chunk
    with open(work, "ab") as fh:  # and a line torn by a kill
        fh.write(b'{"index": 4, "status": "gener')
    calls = []

    def again(*a):
        calls.append(1)
        return Echo(), tok, 1024

    resumed = stage(tmp_path, "cut", records, again)
    assert calls == [1]
    assert (tmp_path / "cut" / "train.jsonl").read_bytes() == (
        tmp_path / "whole" / "train.jsonl"
    ).read_bytes()
    assert resumed["counts"] == whole["counts"]
    assert not work.exists()
    c = whole["counts"]
    assert c["input"] == 10 and c["generated"] + c["skipped"] + c["failed"] == 10


def test_bad_answers_are_counted_by_kind_and_counts_add_up(tmp_path):
    tok = load_tokenizer(TOY)
    # "q": nothing to answer (a user turn alone would be a prompt, answered)
    records = shipped(4) + [{"id": "q", "messages": [{"role": "system", "content": "hi"}]}]
    records.append(
        {
            "id": "long",
            "messages": [
                {"role": "user", "content": "word " * 900},
                {"role": "assistant", "content": "ok"},
            ],
        }
    )
    # answers 1 and 3 (of conversations 0 and 2) empty, answer 2 cut at the limit
    summary = stage(
        tmp_path, "o", records, lambda *a: (Echo(empty_at={1, 3}, cut_at={2}), tok, 400)
    )
    c = summary["counts"]
    assert (c["input"], c["generated"], c["skipped"], c["failed"]) == (6, 2, 4, 0)
    assert c["kinds"] == {
        "answers": 2,
        "answers_dropped": 3,
        "cut_at_limit": 1,
        "empty_answer": 2,
        "no_assistant_turn": 1,
        "prompt_too_long": 1,
    }
    lines = (tmp_path / "o" / "train.jsonl").read_text().splitlines()
    kept = [json.loads(line)["id"] for line in lines]
    assert kept == [records[1]["id"], records[3]["id"]]
    assert summary["input_sha256"] and summary["versions"]["python"]


def test_no_answer_is_asked_past_the_samples_cut(tmp_path):
    """Extraction cuts every sample at dataset.max_tokens: once a conversation's prompt is that
    long, its later answers would be cut away, so none is asked for; they are counted apart
    from problems, and the conversation keeps the answers given before."""
    tok = load_tokenizer(TOY)
    turn = [{"role": "user", "content": "word " * 60}, {"role": "assistant", "content": "ok"}]
    records = [{"id": "long", "messages": turn * 4}, *shipped(1)]
    gen = Echo()

    def factory(*a):
        return gen, tok, 4096

    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    job = SplitJob(data=data, target=TOY, out=tmp_path / "o" / "train.jsonl", split="train",
                   sample_tokens=100)  # fmt: skip
    c = regenerate_split(job, SETTINGS, progress=False, generator_factory=factory)["counts"]
    # the long one: its first prompt (68 tokens) answered, the second (over 130) not
    assert c["kinds"]["past_max_tokens"] == 1 and c["kinds"]["answers_past"] == 3, c
    assert "answers_dropped" not in c["kinds"] and c["generated"] == 2
    long = json.loads((tmp_path / "o" / "train.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in long["messages"]] == ["user", "assistant"]
    # without the cut, every turn is answered
    whole = stage(tmp_path, "all", records, lambda *a: (Echo(), tok, 4096))
    assert whole["counts"]["kinds"]["answers"] == 4 + 1


class Streaming(Echo):
    """Echo that reports its answers' tokens one at a time, as a decoding backend does."""

    on_tokens = None

    def generate(self, prompts):
        answers = super().generate(prompts)
        for answer in answers:
            for _ in answer.ids:
                self.on_tokens(1)
        return answers


def test_the_job_log_gets_a_progress_line_every_few_seconds_in_turns_and_tokens(
    tmp_path, monkeypatch
):
    import contextlib
    import io

    from eyrie.common import progress

    monkeypatch.setattr(progress, "LOG_INTERVAL_S", 0.0)  # every update, for the test
    tok = load_tokenizer(TOY)
    records = shipped(5) + shipped(3, multi_turn=True)
    records.append({"id": "long", "messages": [
        {"role": "user", "content": "word " * 900}, {"role": "assistant", "content": "ok"},
    ]})  # fmt: skip
    turns = sum(m["role"] == "assistant" for r in records for m in r["messages"])
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    job = SplitJob(data=data, target=TOY, out=tmp_path / "o" / "train.jsonl", split="train")
    log = io.StringIO()  # a job's log: rule_log sends stderr there
    backend = lambda *a: (Streaming(empty_at={2}), tok, 400)  # noqa: E731
    with contextlib.redirect_stderr(log):
        regenerate_split(job, SETTINGS, progress=True, generator_factory=backend)
    text = log.getvalue()
    assert "\r" not in text  # a line per refresh, not a bar redrawn in place
    lines = [line for line in text.splitlines() if line.startswith("regenerate train:")]
    assert len(lines) > 4
    assert all(re.search(r"\d+/" + str(turns) + r" \[", line) for line in lines)
    counted = re.compile(r"(\d+) new tokens, \d+ tokens/s")
    tokens = [int(m.group(1)) for m in map(counted.search, lines) if m]
    assert len(set(tokens)) > 2  # tokens move between turns
    assert f"{turns}/{turns} [" in lines[-1]  # every turn settled, dropped ones included


def test_the_hf_generator_reports_every_decoding_steps_tokens(toy):
    model, tok = toy
    prompts = []
    for rec in shipped(4):
        text = render(tok, rec["messages"][:-1], add_generation_prompt=True)
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
    gen = HFGenerator(model, tok, max_new_tokens=12, temperature=0.0, batch_size=3)
    steps = []
    gen.on_tokens = steps.append
    answers = gen.generate(prompts)
    assert len(steps) > 2 * 2  # step by step in each of the 2 batches, not once a batch
    assert sum(steps) == sum(len(a.ids) + a.stopped for a in answers)  # live rows only


def test_a_second_job_on_the_same_split_is_refused(tmp_path):
    tok = load_tokenizer(TOY)
    work = tmp_path / "w" / ".work" / "train.jsonl"
    work.parent.mkdir(parents=True)
    with open(work, "ab") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        with pytest.raises(RegenerateError, match="locked by another regenerate job"):
            stage(tmp_path, "w", shipped(2), lambda *a: (Echo(), tok, 1024))


def test_max_new_tokens_beyond_the_target_positions_is_refused(tmp_path):
    tok = load_tokenizer(TOY)
    with pytest.raises(RegenerateError, match="regenerate.max_new_tokens"):
        stage(tmp_path, "m", shipped(2), lambda *a: (Echo(), tok, 16))


# ---------------------------------------------------------------------------------------------
# the sglang backend, against a fake server launched by the job itself

FAKE_SGLANG = fake_server(
    setup="""
import os
STOP = int(os.environ.get("FAKE_STOP", "2"))
""",
    post="""
ids = req["input_ids"]
sp = req["sampling_params"]
n = sp["max_new_tokens"]
if sum(ids) % 7 == 3:  # this prompt's request always fails
    self._send(500, {"error": "boom"})
    return
body = [t for t in ids[-5:] if t > 2][:n]  # echo a little of the prompt
if len(body) < n and STOP in sp["stop_token_ids"]:
    out, reason = body + [STOP], {"type": "stop", "matched": STOP}
else:
    out, reason = (body + [5] * n)[:n], {"type": "length", "length": n}
self._send(200, {"output_ids": out, "meta_info": {"finish_reason": reason}})
""",
)


def test_sglang_backend_launches_answers_counts_failures_and_stops_its_server(tmp_path):
    from functools import partial

    from eyrie.regenerate.sglang import sglang_generator

    tok = load_tokenizer(TOY)
    fake = tmp_path / "fake_sglang.py"
    fake.write_text(FAKE_SGLANG)
    records = shipped(8) + shipped(2, multi_turn=True)
    settings = {**SETTINGS, "backend": "sglang", "sglang": {"launch_timeout_s": 60}}
    log = tmp_path / "server.log"
    started = []

    def factory(*a):
        gen = partial(sglang_generator, log_path=log, launcher=[sys.executable, str(fake)])(*a)
        started.append(gen[0])
        return gen

    summary = stage(tmp_path, "s", records, factory, settings)
    c = summary["counts"]
    assert c["input"] == 10 and c["generated"] + c["skipped"] + c["failed"] == 10
    assert c["generated"] >= 1
    # the independent check: what the fake answers each first prompt, by the same rule
    lost = 0
    for rec in records:
        first = next(i for i, m in enumerate(rec["messages"]) if m["role"] == "assistant")
        prompt = render(tok, rec["messages"][:first], add_generation_prompt=True)
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        lost += sum(ids) % 7 == 3
    assert c["failed"] == lost and c["kinds"].get("request_failed", 0) >= lost
    assert "--skip-tokenizer-init" in log.read_text() and "127.0.0.1" in log.read_text()
    from eyrie.sglang.http import http_ok

    assert not http_ok(f"{started[0].url}/health", timeout=2)  # the stage stopped the server
    for line in (tmp_path / "s" / "train.jsonl").read_text().splitlines():
        rec = json.loads(line)
        assert all(m["content"] for m in rec["messages"] if m["role"] == "assistant")
