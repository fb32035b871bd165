"""Turn by turn: every user turn of a conversation answered by the target.

The target gives an answer wherever the conversation has an assistant turn (which its answer
replaces), and after each user turn that no assistant turn answers (`answer_slots`): a trailing
question, or a conversation of questions alone (MT-bench's two turns, prompts-only data), whose
second question is asked after the target's own first answer. Conversations are regenerated
together, one answer at a time: round r asks the target for the r-th answer of every
conversation still going, each prompt rendered with the target's chat template from the
conversation so far (its earlier answers already the target's own). A conversation ends early
when an answer is empty or a prompt would not leave room for `max_new_tokens`; what was
regenerated before that point is kept. Each outcome is counted by kind, so generated + skipped +
failed always equals the input.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from eyrie.data.chat_tokens import answer_slots, render

# Outcome of one conversation.
GENERATED = "generated"  # every answer is the target's (some may be cut at the limit)
SKIPPED = "skipped"  # no answer could be regenerated (the kind says why)
FAILED = "failed"  # lost to a failed request (sglang, after retries); hf stops the job instead


@dataclass
class Outcome:
    index: int  # position in the input file
    status: str  # GENERATED, SKIPPED or FAILED
    record: dict | None  # the regenerated conversation (None unless GENERATED)
    kinds: Counter = field(default_factory=Counter)  # answers by kind, and why a turn was dropped

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "status": self.status,
            "record": self.record,
            "kinds": dict(self.kinds),
        }

    @classmethod
    def from_json(cls, obj: dict) -> Outcome:
        return cls(obj["index"], obj["status"], obj["record"], Counter(obj["kinds"]))


def regenerate_conversations(
    records: list[dict],
    first_index: int,
    generator,
    tokenizer,
    max_prompt_tokens: int,
    on_turns=None,
    sample_tokens: int | None = None,
) -> list[Outcome]:
    """Outcomes of `records` (prepared dataset lines) with their answers regenerated.

    A conversation whose prompt reaches `sample_tokens` (dataset.max_tokens, where extraction
    cuts every sample) gets no more answers: they would all be cut away. Its later turns are
    counted as `past_max_tokens`, not as a problem.

    `on_turns(n)`, when given, hears of every answer settled (given, or dropped with its
    conversation), round by round: over a split they add up to `assistant_turns` of it.
    An exception of the generator is not caught: nothing of the chunk is written, and a rerun
    regenerates it (the stage's resume).
    """
    settled = on_turns or (lambda n: None)
    outcomes = [Outcome(first_index + k, SKIPPED, None) for k in range(len(records))]
    kept: list[list[dict]] = [[] for _ in records]  # messages so far, answers the target's
    rest = [answer_slots(rec["messages"]) for rec in records]  # turns not yet handled
    live = [k for k, rec in enumerate(records) if _answers(rec["messages"])]
    for k, rec in enumerate(records):
        if not _answers(rec["messages"]):
            outcomes[k].kinds["no_assistant_turn"] += 1
    while live:
        asks = []
        for k in live:
            while rest[k] and rest[k][0]["role"] != "assistant":  # turns up to the next answer
                kept[k].append(rest[k].pop(0))
            if not rest[k]:
                continue  # every answer done
            prompt = render(tokenizer, kept[k], add_generation_prompt=True)
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            answered = any(m["role"] == "assistant" for m in kept[k])
            if sample_tokens is not None and len(ids) >= sample_tokens and answered:
                settled(_stop(outcomes[k], rest[k], "past_max_tokens", "answers_past"))
                continue
            if len(ids) > max_prompt_tokens:
                settled(_stop(outcomes[k], rest[k], "prompt_too_long"))
                continue
            asks.append((k, ids))
        if not asks:
            break
        answers = generator.generate([ids for _, ids in asks])  # an error stops the chunk
        live = []
        done = 0
        for (k, _), answer in zip(asks, answers, strict=True):
            if answer.failed:
                done += _stop(outcomes[k], rest[k], "request_failed")
                continue
            text = tokenizer.decode(answer.ids, skip_special_tokens=True).strip()
            if not text:
                done += _stop(outcomes[k], rest[k], "empty_answer")
                continue
            done += 1
            outcomes[k].kinds["answers"] += 1
            if not answer.stopped:
                outcomes[k].kinds["cut_at_limit"] += 1
            rest[k].pop(0)  # the answer's slot (the source's answer, if any), now the target's
            kept[k].append({"role": "assistant", "content": text})
            live.append(k)
        settled(done)
    for k, rec in enumerate(records):
        msgs = kept[k]
        while msgs and msgs[-1]["role"] != "assistant":  # a question left without its answer
            msgs.pop()
        if msgs:
            outcomes[k].status = GENERATED
            outcomes[k].record = {**rec, "messages": msgs}
        elif outcomes[k].kinds["request_failed"]:
            outcomes[k].status = FAILED
    return outcomes


def _answers(messages: list[dict]) -> int:
    """The answers the target gives in `messages` (answer slots included)."""
    return sum(m["role"] == "assistant" for m in answer_slots(messages))


def assistant_turns(records: list[dict]) -> int:
    """The answers a list of prepared conversations asks the target for."""
    return sum(_answers(rec["messages"]) for rec in records)


def _stop(outcome: Outcome, rest: list[dict], kind: str, counted="answers_dropped") -> int:
    """End a conversation here: this turn and the answers after it are dropped (returned)."""
    dropped = sum(m["role"] == "assistant" for m in rest)  # rest holds the slots already
    outcome.kinds[kind] += 1
    outcome.kinds[counted] += dropped
    rest.clear()
    return dropped


def count(outcomes: list[Outcome]) -> dict:
    """Conversations by status and answers by kind, over a whole split."""
    status = Counter(o.status for o in outcomes)
    kinds: Counter = Counter()
    for o in outcomes:
        kinds.update(o.kinds)
    return {
        "input": len(outcomes),
        **{s: status.get(s, 0) for s in (GENERATED, SKIPPED, FAILED)},
        "kinds": dict(sorted(kinds.items())),
    }
