"""Plain greedy against speculative decoding of the same prompts, timed interleaved and repeated.

Why interleaved: a ratio of two runs timed one after the other measures the machine's load as
much as the decoding (on one busy machine the same drafter, with the same acceptance, gave 1.12×
and 0.76×). Here each prompt is decoded plainly and speculatively back to back (plain p1, spec
p1, plain p2, spec p2, ...), so both sides of a pair see the same load; the order within a pair
flips from one repeat to the next, so neither always runs first (on warmer caches, after a
frequency step); and the whole pass is repeated ``repeats`` times. Each repeat gives one
speed-up, its summed plain time over its summed speculative time for the same tokens; the
record states their median and their spread (min, max).

Tokens/s are new tokens over wall-clock seconds, prefill included (both pay it; speculation
also pays the drafter's pass over the prompt). Accept length counts the bonus token: tokens
emitted per target verify pass, as SGLang's spec_accept_length does.

A conversation of several turns (MT-bench's two questions) is decoded as MT-bench's own answer
generation does it (`decode_turns`): turn 1, then the conversation with that answer and the next
question rendered again with the chat template and decoded from a new prefill, and so on. Plain
and speculative decoding each answer every turn themselves; their answers are the same when
decoding is exact, so each later turn's prompt is too. Every turn counts: its new tokens, its
seconds (the rendering between turns is not timed), its verify passes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from eyrie.common.progress import bar
from eyrie.data.chat_tokens import render
from eyrie.evaluate.draft_runner import DraftRunner
from eyrie.evaluate.speculate import Generation, greedy_generate, speculative_generate
from eyrie.evaluate.target_runner import SpeculateError, Target
from eyrie.evaluate.tree import tree_generate, tree_shape


def plain_first(repeat: int) -> bool:
    """Whether plain decoding opens each pair in this repeat (it alternates, plain first)."""
    return repeat % 2 == 0


def interleaved(
    prompts: list[dict],
    plain: Callable[[dict], Generation],
    spec: Callable[[dict], Generation],
    repeats: int,
    progress: bool = False,
) -> list[list[tuple[Generation, Generation]]]:
    """runs[r][i] = (plain, speculative) generation of prompt i in repeat r, decoded as a pair
    back to back, plain first in even repeats and speculative first in odd ones. `progress`: a
    bar of pairs (between pairs, outside the timed generations)."""
    if repeats < 1:
        raise SpeculateError(f"evaluate.repeats must be at least 1, got {repeats}")
    meter = bar(
        total=repeats * len(prompts), desc="plain vs speculative", unit="pair",
        disable=not progress,
    )  # fmt: skip
    runs = []
    for r in range(repeats):
        pairs = []
        for p in prompts:
            if plain_first(r):
                a = plain(p)
                b = spec(p)
            else:
                b = spec(p)
                a = plain(p)
            pairs.append((a, b))
            meter.update(1)
        runs.append(pairs)
    meter.close()
    return runs


def answer_text(tokenizer, tokens: list[int]) -> str:
    """A decoded answer as the next turn's prompt holds it (as regeneration writes answers)."""
    return tokenizer.decode(tokens, skip_special_tokens=True).strip()


def decode_turns(
    decode: Callable[[list[int]], Generation], prompt: dict, tokenizer=None
) -> Generation:
    """Every turn of ``prompt`` (eyrie.evaluate.loading.load_prompts) decoded by
    ``decode(input_ids)``: the first turn, then for each follow-up the conversation so far (the
    earlier answers ``decode``'s own) and the follow-up's turns, rendered with the chat
    template's generation prompt and decoded from a new prefill. One Generation: the turns'
    tokens, seconds and accepted drafts in order, ``turns`` its new tokens per turn."""
    gen = decode(prompt["input_ids"])
    follow_ups = prompt.get("follow_ups") or []
    if not follow_ups:
        return gen
    if tokenizer is None:
        raise SpeculateError(f"prompt {prompt['id']} has {1 + len(follow_ups)} turns: decoding "
                             "the later ones needs the target's tokenizer")  # fmt: skip
    messages = list(prompt["messages"])
    tokens, seconds, accepted, turns, margins = [], 0.0, [], [], []
    for extra in [None, *follow_ups]:
        if extra is not None:
            messages += [{"role": "assistant", "content": answer_text(tokenizer, gen.tokens)}]
            messages += extra
            text = render(tokenizer, messages, add_generation_prompt=True)
            gen = decode(tokenizer(text, add_special_tokens=False)["input_ids"])
        tokens += gen.tokens
        seconds += gen.seconds
        accepted += gen.accepted
        margins += gen.margins
        turns.append(len(gen.tokens))
    return Generation(tokens, seconds, accepted, turns, margins)


def compare(
    target: Target,
    drafter: DraftRunner,
    prompts: list[dict],
    *,
    k: int,
    max_new_tokens: int,
    eos=(),
    warmup: int = 1,
    repeats: int = 3,
    topk: int = 1,
    verify_tokens: int | None = None,
    progress: bool = False,
    tokenizer=None,
) -> dict:
    """Plain greedy vs speculative decoding of the same prompts, batch 1, interleaved prompt by
    prompt and repeated (see the module's docstring); the record of ``summarize``. ``k`` drafts
    per step in a chain (``topk`` 1), or a tree of k steps, ``topk`` branches and
    ``verify_tokens`` tokens verified (eyrie/evaluate/tree.py). A prompt of several turns is
    decoded turn by turn (``decode_turns``, which needs ``tokenizer``), each turn up to
    ``max_new_tokens``."""
    if repeats < 1:
        raise SpeculateError(f"evaluate.repeats must be at least 1, got {repeats}")
    verify = tree_shape(k, topk, verify_tokens)

    def spec(ids, new_tokens):
        if topk == 1:
            return speculative_generate(target, drafter, ids, k, new_tokens, eos)
        return tree_generate(target, drafter, ids, k, topk, verify, new_tokens, eos)

    for p in prompts[:warmup]:  # first calls allocate and pick kernels; not timed
        greedy_generate(target, p["input_ids"], min(8, max_new_tokens), eos)
        spec(p["input_ids"], min(8, max_new_tokens))

    def plain_turns(p):
        return decode_turns(lambda ids: greedy_generate(target, ids, max_new_tokens, eos), p,
                            tokenizer)  # fmt: skip

    def spec_turns(p):
        return decode_turns(lambda ids: spec(ids, max_new_tokens), p, tokenizer)

    runs = interleaved(prompts, plain_turns, spec_turns, repeats, progress)
    return {**summarize(rows_of(prompts, runs), k), "topk": topk, "verify_tokens": verify}


def rows_of(prompts: list[dict], runs: list[list[tuple[Generation, Generation]]]) -> list[dict]:
    """One row per prompt over every repeat. A prompt is ``identical`` only when every output,
    plain and speculative, of every repeat is the same token sequence; its seconds are the
    median over the repeats, each repeat's kept in ``plain_s_repeats``/``spec_s_repeats``."""
    rows = []
    for i, p in enumerate(prompts):
        pairs = [run[i] for run in runs]
        plain0, spec0 = pairs[0]
        plain_s = [a.seconds for a, _ in pairs]
        spec_s = [b.seconds for _, b in pairs]
        rows.append(
            {
                "id": p["id"],
                "prompt_tokens": len(p["input_ids"]),  # the first turn's
                "turns": len(plain0.turn_tokens),
                "turn_tokens": plain0.turn_tokens,
                "new_tokens": len(plain0.tokens),
                "plain_s": statistics.median(plain_s),
                "spec_s": statistics.median(spec_s),
                "verify_steps": spec0.verify_steps,
                "accepted": spec0.accepted,
                "identical": all(a.tokens == plain0.tokens == b.tokens for a, b in pairs),
                "identical_repeats": [a.tokens == b.tokens for a, b in pairs],
                "first_difference": first_difference(pairs),
                "plain_s_repeats": plain_s,
                "spec_s_repeats": spec_s,
            }
        )
    return rows


def first_difference(pairs: list[tuple[Generation, Generation]]) -> dict | None:
    """Where the first repeat whose outputs differ parts: the new token's index, both tokens,
    and plain greedy's top-1 minus top-2 logit there (``margin``; None where not recorded).
    A margin within the dtype's rounding (bf16 keeps 8 bits) is a near tie that a verify pass
    over several tokens may round the other way; a large one points at a fault."""
    for repeat, (plain, spec) in enumerate(pairs):
        if plain.tokens == spec.tokens:
            continue
        i = next(
            (j for j, (a, b) in enumerate(zip(plain.tokens, spec.tokens, strict=False)) if a != b),
            min(len(plain.tokens), len(spec.tokens)),
        )
        return {"repeat": repeat, "index": i, "plain": _at(plain.tokens, i),
                "spec": _at(spec.tokens, i), "margin": _at(plain.margins, i)}  # fmt: skip
    return None


def _at(xs: list, i: int):
    return xs[i] if i < len(xs) else None


def _median(xs: list[float]) -> float:
    return float("nan") if not xs or any(math.isnan(x) for x in xs) else statistics.median(xs)


def _column(rows: list[dict], key: str, repeat: int) -> float:
    """The seconds ``key`` of every prompt summed for one repeat."""
    return sum((r.get(f"{key}_repeats") or [r[key]])[repeat] for r in rows)


def summarize(rows: list[dict], k: int) -> dict:
    """Totals of per-prompt rows (see ``rows_of``; a row without ``*_s_repeats`` is one run).

    ``speedup`` is the median of the repeats' speed-ups (``speedup_repeats``, spread in
    ``speedup_min``/``speedup_max``); ``plain_seconds``/``spec_seconds`` are the medians of the
    repeats' summed seconds, and the tokens/s are the new tokens over those.
    """
    tokens = sum(r["new_tokens"] for r in rows)
    repeats = max([len(r.get("plain_s_repeats") or [0]) for r in rows] or [1])
    plain_runs = [_column(rows, "plain_s", j) for j in range(repeats)]
    spec_runs = [_column(rows, "spec_s", j) for j in range(repeats)]
    # the same tokens on both sides: tokens/s over tokens/s is plain seconds over spec seconds
    speedups = [
        p / s if p > 0 and s > 0 else float("nan")
        for p, s in zip(plain_runs, spec_runs, strict=True)
    ]
    plain_s, spec_s = _median(plain_runs), _median(spec_runs)
    accepted = [a for r in rows for a in r["accepted"]]
    steps = len(accepted)
    # tokens emitted by verify passes (each turn's first new token comes from its prefill); the
    # last pass of a turn may emit fewer than a + 1 when max_new_tokens or an eos cuts it
    turns = sum(r.get("turns", 1) for r in rows)
    emitted_by_spec = sum(r["new_tokens"] for r in rows) - turns
    hist = [accepted.count(a) for a in range(k + 1)]
    plain_tps = tokens / plain_s if plain_s > 0 else float("nan")
    spec_tps = tokens / spec_s if spec_s > 0 else float("nan")
    finite = [s for s in speedups if not math.isnan(s)]
    return {
        "draft_tokens": k,
        "prompts": len(rows),
        "turns": turns,  # decodes: a prompt of two turns (MT-bench) counts two
        "new_tokens": tokens,
        "plain_seconds": plain_s,
        "spec_seconds": spec_s,
        "plain_tokens_per_s": plain_tps,
        "spec_tokens_per_s": spec_tps,
        "speedup": _median(speedups),
        "verify_steps": steps,
        # emitted per verify pass, bonus included; the first token comes from the prefill
        "accept_length": emitted_by_spec / steps if steps else float("nan"),
        "accepted_drafts_mean": sum(accepted) / steps if steps else float("nan"),
        "accept_histogram": hist,
        "identical": sum(bool(r["identical"]) for r in rows),
        # plain greedy's top-two logit gap where each non-identical prompt's outputs part
        "difference_margins": [
            (r.get("first_difference") or {}).get("margin") for r in rows if not r["identical"]
        ],
        "timing": "interleaved",  # plain and speculative back to back, prompt by prompt
        "repeats": repeats,
        "plain_first": [plain_first(j) for j in range(repeats)],
        "speedup_repeats": speedups,
        "speedup_min": min(finite) if finite else float("nan"),
        "speedup_max": max(finite) if finite else float("nan"),
        "plain_seconds_repeats": plain_runs,
        "spec_seconds_repeats": spec_runs,
        "rows": rows,
    }
