"""benchmarks/context_lookup.py: its walk against a plain simulation, and a run on the toy."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from lookup_reference import scan_lookup

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "context_lookup.py"
sys.path.insert(0, str(ROOT / "benchmarks"))  # its `import common`
_spec = importlib.util.spec_from_file_location("context_lookup_bench", SCRIPT)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def simulated_walk(ids, mask, k):
    """Decode each answer span: draft by scanning the true prefix, accept while right."""

    tokens = steps = 0
    p = 0
    while p < len(ids):
        if not mask[p]:
            p += 1
            continue
        drafts, ctx = [], list(ids[:p])
        for _ in range(k):  # a real chain drafts on its own guesses
            drafts.append(scan_lookup(ctx))
            ctx.append(drafts[-1])
        accepted = 0
        for d in drafts:
            q = p + accepted
            if q >= len(ids) or not mask[q] or d != ids[q]:
                break
            accepted += 1
        p += accepted + 1
        tokens, steps = tokens + accepted + 1, steps + 1
    return tokens, steps


def test_the_walk_from_guesses_equals_a_chain_drafted_on_its_own_guesses():
    from eyrie.evaluate.baselines import context_lookup

    ids = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 5, 4, 1, 2, 3, 9, 9, 1, 2, 3, 4]
    mask = [0] * 4 + [1] * (len(ids) - 4)
    for k in (1, 3, 7):
        assert bench.answer_walk(ids, context_lookup(ids), mask, k) == simulated_walk(ids, mask, k)


def test_runs_on_the_toy_and_prints_both_predictors(tmp_path):
    answer = "one two three, one two three, one two three"
    rows = [{"id": "a", "messages": [{"role": "user", "content": "Say it twice."},
                                     {"role": "assistant", "content": answer}]}]  # fmt: skip
    src = tmp_path / "heldout.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    acc = tmp_path / "acceptance.json"
    acc.write_text(json.dumps({"acc": [0.25], "walk_accept_length_by_draft_tokens": [1.2] * 7}))
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--jsonl", str(src), "--target", "models/toy-llama",
         "--acceptance", str(acc)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "context lookup (last 4 to 1 tokens): acc_0 0." in out
    assert "context lookup: decoding walk, chain of 7:" in out
    assert "the drafter (same held-out answers): acc_0 0.250" in out
