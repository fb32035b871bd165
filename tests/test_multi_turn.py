"""Held-out prompts of several turns (MT-bench's two questions) in the transformers loop: each
turn decoded after the loop's own earlier answers, every output equal to cacheless greedy
decoding of the same conversation, every turn counted."""

from __future__ import annotations

import json

import pytest
import test_speculate
from test_speculate import reference_greedy
from tiny_target import build_tokenizer

from eyrie.data.chat_tokens import render
from eyrie.evaluate import compare as cmp
from eyrie.evaluate.compare import decode_turns
from eyrie.evaluate.loading import load_prompts
from eyrie.evaluate.speculate import Generation, greedy_generate, speculative_generate
from eyrie.evaluate.target_runner import SpeculateError
from eyrie.evaluate.tree import tree_generate

# the chain's fixtures: one torch thread, a tiny Llama target with an untrained drafter
one_thread, tiny = test_speculate.one_thread, test_speculate.tiny
N = 10  # new tokens per turn


def user(text: str) -> dict:
    return {"role": "user", "content": text}


CONVERSATIONS = [
    # MT-bench, prepared: two questions, no answer
    {"id": "81", "messages": [user("Tell me a story."), user("Now tell it in numbers.")],
     "category": "writing"},
    # answered conversations: the loop answers both questions itself, the dataset's answers unused
    {"id": "two", "messages": [
        {"role": "system", "content": "Be brief."}, user("What is two plus two?"),
        {"role": "assistant", "content": "Four."}, user("And the fox?"),
        {"role": "assistant", "content": "It jumps."}]},
    {"id": "one", "messages": [user("Hello there!"), {"role": "assistant", "content": "Hi."}]},
    {"id": "trailing", "messages": [user("Hello there!"), {"role": "assistant", "content": "Hi."},
                                    user("How are you today?")]},
]  # fmt: skip


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    tok = build_tokenizer(folder)  # the tiny target's tokenizer (same corpus, same vocabulary)
    jsonl = folder / "heldout.jsonl"
    jsonl.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    return tok, load_prompts(jsonl, tok, len(CONVERSATIONS))


def reference_turns(model, tok, prompt: dict) -> list[list[int]]:
    """Each turn by cacheless greedy decoding, the next question asked after its own answer."""
    messages, out = list(prompt["messages"]), []
    ids = prompt["input_ids"]
    for extra in [None, *prompt["follow_ups"]]:
        if extra is not None:
            answer = tok.decode(out[-1], skip_special_tokens=True).strip()
            messages += [{"role": "assistant", "content": answer}, *extra]
            text = render(tok, messages, add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]
        out.append(reference_greedy(model, ids, N))
    return out


def test_load_prompts_splits_conversations_into_turns(prompts):
    tok, ps = prompts
    assert [p["id"] for p in ps] == ["81", "two", "one", "trailing"]
    assert [1 + len(p["follow_ups"]) for p in ps] == [2, 2, 1, 2]
    assert ps[0]["messages"] == [user("Tell me a story.")]
    assert ps[0]["follow_ups"] == [[user("Now tell it in numbers.")]]
    assert ps[1]["messages"][0]["role"] == "system"
    assert ps[3]["follow_ups"] == [[user("How are you today?")]]  # a trailing question is asked
    want = render(tok, ps[0]["messages"], add_generation_prompt=True)
    assert ps[0]["input_ids"] == tok(want, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("way", ["plain", "chain", "tree"])
def test_each_turn_is_greedy_after_its_own_answer(tiny, prompts, way):
    target, runner, _ = tiny
    tok, ps = prompts
    decode = {
        "plain": lambda ids: greedy_generate(target, ids, N),
        "chain": lambda ids: speculative_generate(target, runner, ids, 3, N),
        "tree": lambda ids: tree_generate(target, runner, ids, 3, 2, 6, N),
    }[way]
    for p in ps:
        want = reference_turns(target.model, tok, p)
        got = decode_turns(decode, p, tok)
        assert got.tokens == [t for turn in want for t in turn], p["id"]
        assert got.turn_tokens == [N] * len(want)
        if way != "plain":  # one verify pass per token after each turn's prefill
            assert got.verify_steps >= len(want) and len(got.accepted) == got.verify_steps
    # the second question follows the loop's own answer, not the dataset's ("Four.")
    two = ps[1]
    theirs = two["messages"] + [{"role": "assistant", "content": "Four."}, *two["follow_ups"][0]]
    ids = tok(render(tok, theirs, add_generation_prompt=True), add_special_tokens=False)
    assert reference_greedy(target.model, ids["input_ids"], N) != got_two(decode, two, tok)[N:]


def got_two(decode, prompt, tok) -> list[int]:
    return decode_turns(decode, prompt, tok).tokens


def test_compare_counts_every_turn_and_stays_identical(tiny, prompts, monkeypatch):
    target, runner, _ = tiny
    tok, ps = prompts
    calls = []
    real = cmp.greedy_generate

    def recorded(target_, ids, n, eos=()):
        calls.append(len(ids))
        return real(target_, ids, n, eos)

    monkeypatch.setattr(cmp, "greedy_generate", recorded)
    rec = cmp.compare(target, runner, ps, k=2, max_new_tokens=N, repeats=1, warmup=0,
                      tokenizer=tok)  # fmt: skip
    assert rec["prompts"] == 4 and rec["turns"] == 7 and rec["new_tokens"] == 7 * N
    assert rec["identical"] == 4
    assert [r["turns"] for r in rec["rows"]] == [2, 2, 1, 2]
    assert [r["turn_tokens"] for r in rec["rows"]][0] == [N, N]
    # verify passes emit every token but each turn's first (from its prefill)
    assert rec["accept_length"] == pytest.approx((7 * N - 7) / rec["verify_steps"])
    # plain decoding ran 7 prefills; a later turn's prompt holds the turns before it
    assert len(calls) == 7 and calls[1] > calls[0] + N
    with pytest.raises(SpeculateError, match="needs the target's tokenizer"):
        cmp.compare(target, runner, ps[:1], k=2, max_new_tokens=N, repeats=1, warmup=0)


def test_summary_counts_one_prefill_token_per_turn():
    rows = [
        {"new_tokens": 9, "turns": 2, "plain_s": 2.0, "spec_s": 1.0, "accepted": [3, 0, 2],
         "identical": True},
        {"new_tokens": 3, "plain_s": 1.0, "spec_s": 2.0, "accepted": [1], "identical": True},
    ]  # fmt: skip
    s = cmp.summarize(rows, k=3)
    assert s["turns"] == 3
    assert s["accept_length"] == pytest.approx((7 + 2) / 4)


def test_a_turn_that_differs_makes_the_prompt_not_identical():
    ps = [{"id": "a", "input_ids": [1]}]
    same = Generation([5, 6, 7, 8], 1.0, [1], [2, 2])
    changed = Generation([5, 6, 7, 9], 1.0, [1], [2, 2])  # the second turn's last token
    rows = cmp.rows_of(ps, [[(same, changed)]])
    assert rows[0]["identical"] is False and rows[0]["turns"] == 2
