"""Offline acceptance metrics: a hand-computed example, the training metric, real stores."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lookup_reference import scan_lookup
from tiny_target import build_llama

from eyrie.evaluate.acceptance import (
    AcceptanceError,
    count_acceptance,
    evaluate_stores,
    greedy_tokens,
    load_drafter,
    lookup_guesses,
    metrics,
)
from eyrie.store.shard import ShardWriter
from eyrie.target.tensors import read_target_tensors
from eyrie.train.model import Drafter, DrafterConfig


def test_hand_computed_example():
    # positions 0..6; greedy[t] is the target's token after position t
    greedy = torch.tensor([[10, 11, 12, 13, 14, 15, 16]])
    mask = torch.tensor([[0, 0, 1, 1, 0, 1, 1]], dtype=torch.bool)
    # step 0, row t must equal greedy[t+1]: rows 0, 2, 4 right
    d0 = torch.tensor([[11, 99, 13, 99, 15, 0, 0]])
    # step 1, row t must equal greedy[t+2]: rows 0, 1 right
    d1 = torch.tensor([[12, 13, 99, 99, 0, 0, 0]])
    in_vocab = greedy != 15
    c = count_acceptance([d0, d1], greedy, mask, in_vocab)
    # step 0 scores rows whose token t+2 is masked: t in {0, 1, 3, 4}; right: 0 and 4
    assert c.scored.tolist() == [4, 3]  # step 1 scores t in {0, 2, 3} (token t+3 masked)
    assert c.correct.tolist() == [2, 1]  # step 1: only row 0 of {0, 2, 3}
    assert c.reachable.tolist() == [3, 2]  # greedy 15 (row 4 at step 0, row 3 at step 1)
    # full chains need tokens t+2 and t+3 masked: rows 0 and 3
    assert c.chains == 2
    assert c.chain_correct.tolist() == [1, 1]  # row 0 right at both steps, row 3 at neither
    m = metrics(c)
    assert m.acc == pytest.approx([0.5, 1 / 3])
    assert m.chain == pytest.approx([0.5, 0.5])
    assert m.cond_acc == pytest.approx([0.5, 1.0])
    assert m.tau == pytest.approx([0.5, 1.0])  # E[accepted drafts] with K = 1, 2
    assert m.tau_with_bonus == pytest.approx([1.5, 2.0])
    assert m.reachable == pytest.approx([0.75, 2 / 3])

    # counts of two batches add up; a second identical batch leaves the rates unchanged
    m2 = metrics(c + count_acceptance([d0, d1], greedy, mask, in_vocab))
    assert m2.scored == [8, 6] and m2.acc == pytest.approx(m.acc)


def test_decoding_walk_by_hand():
    # the hand example above: turn 1 (positions 2, 3) starts at row 1, whose draft of token 3
    # is wrong: one step, one token (the bonus). Turn 2 (5, 6) starts at row 4, whose draft of
    # token 6 is right and ends the turn: one step, one token, no bonus.
    greedy = torch.tensor([[10, 11, 12, 13, 14, 15, 16]])
    mask = torch.tensor([[0, 0, 1, 1, 0, 1, 1]], dtype=torch.bool)
    d0 = torch.tensor([[11, 99, 13, 99, 15, 0, 0]])
    d1 = torch.tensor([[12, 13, 99, 99, 0, 0, 0]])
    c = count_acceptance([d0, d1], greedy, mask)
    assert c.walk_steps.tolist() == [2, 2] and c.walk_tokens.tolist() == [2, 2]
    assert metrics(c).walk == [1.0, 1.0]


def test_decoding_walk_every_draft_right():
    # 12 positions, all assistant: tokens 2..11 are decoded (10 tokens). K = 1: 2 a step,
    # 5 steps. K = 2: 3 + 3 + 3 + 1 (the last draft ends the turn: no bonus). K = 3: 4 + 4 + 2.
    T = 12
    greedy = torch.arange(100, 100 + T)[None]
    drafts = [torch.roll(greedy, -(k + 1), dims=1) for k in range(3)]
    m = metrics(count_acceptance(drafts, greedy, torch.ones(1, T, dtype=torch.bool)))
    assert m.walk == pytest.approx([10 / 5, 10 / 4, 10 / 3])


def test_decoding_walk_is_below_tau_when_acceptance_comes_in_runs():
    # the first half all right, the second all wrong: tau + 1 averages over positions, the
    # walk crosses the easy half in long steps and the hard half one token a step
    T, K, half = 42, 3, 21
    greedy = torch.arange(100, 100 + T)[None]
    drafts = []
    for k in range(K):
        d = torch.roll(greedy, -(k + 1), dims=1).clone()
        d[:, half - k - 1 :] = 0  # rows whose draft k lands in the second half are wrong
        drafts.append(d)
    c = count_acceptance(drafts, greedy, torch.ones(1, T, dtype=torch.bool))
    m = metrics(c)
    # tokens 2..41 (40); easy: rows 0, 4, 8, 12, 16 emit 4 each (tokens 2..21), hard: 20 steps
    assert c.walk_tokens[-1] == 40 and c.walk_steps[-1] == 5 + 20
    assert m.walk[-1] == pytest.approx(40 / 25)
    assert m.tau_with_bonus[-1] > m.walk[-1] + 0.2


def test_everything_right_gives_tau_k():
    T, K = 12, 3
    greedy = torch.arange(100, 100 + T)[None]
    drafts = [torch.roll(greedy, -(k + 1), dims=1) for k in range(K)]  # row t: greedy[t+k+1]
    m = metrics(count_acceptance(drafts, greedy, torch.ones(1, T, dtype=torch.bool)))
    assert m.acc == [1.0] * K and m.cond_acc == [1.0] * K
    assert m.tau == pytest.approx([1.0, 2.0, 3.0])
    assert m.chains == T - K - 1


def test_acc_matches_the_training_metric():
    from eyrie.train.loss import ttt_terms

    g = torch.Generator().manual_seed(0)
    B, T, K, V = 3, 20, 4, 7
    greedy = torch.randint(0, V, (B, T), generator=g)
    mask = torch.rand(B, T, generator=g) > 0.3
    drafts = [torch.randint(0, V, (B, T), generator=g) for _ in range(K)]
    logits = [torch.nn.functional.one_hot(d, V).float() for d in drafts]
    probs = torch.full((B, T, V), 1.0 / V)
    terms = ttt_terms(logits, probs, greedy, mask, torch.zeros(V, dtype=torch.long))
    c = count_acceptance(drafts, greedy, mask)
    assert c.correct.tolist() == terms["correct"].long().tolist()
    assert c.correct.sum() > 0


def test_empty_denominators_are_nan_not_errors():
    m = metrics(count_acceptance([torch.zeros(1, 2, dtype=torch.long)], torch.zeros(1, 2,
                dtype=torch.long), torch.ones(1, 2, dtype=torch.bool)))  # fmt: skip
    assert math.isnan(m.acc[0]) and m.chains == 0 and m.tau == [0.0]


# ---------------------------------------------------------------------------------------------
# on stores, against a per-sample loop


AUX = [1, 2, 4]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("acc")
    target = build_llama(root / "target", layers=6, hidden=32)
    cfg = json.loads((target / "config.json").read_text())
    V, H = cfg["vocab_size"], cfg["hidden_size"]
    rng = np.random.default_rng(0)
    samples = []
    store = root / "heldout.zarr"
    with ShardWriter(store, hidden_size=H, aux_layer_ids=AUX, provenance={}) as w:
        for i, n in enumerate([9, 23, 4, 17]):  # ragged: padding must not count
            ids = rng.integers(0, V, n)
            mask = (rng.random(n) > 0.25).astype(np.uint8)
            aux = torch.from_numpy(rng.standard_normal((n, len(AUX), H))).float()
            fin = torch.from_numpy(rng.standard_normal((n, H))).float()
            w.append(f"s{i}", ids, mask, aux, fin)
            samples.append((ids, mask, aux.bfloat16().float(), fin.bfloat16().float()))
        w.finish()
    torch.manual_seed(0)
    dcfg = DrafterConfig.from_target(cfg, num_aux=len(AUX), draft_vocab_size=V // 2)
    model = Drafter(dcfg)
    tokens = torch.sort(torch.randperm(V)[: V // 2]).values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[tokens] = True
    model.set_vocab(tokens - torch.arange(V // 2), t2d)
    folder = root / "drafter"
    folder.mkdir()
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(folder / "model.safetensors"))  # fmt: skip
    meta = {"format": "eyrie-drafter", "layer_convention": "output", "config": dcfg.to_dict(),
            "aux_layer_ids": AUX, "train": {"settings": {"ttt_steps": 3}}}  # fmt: skip
    (folder / "drafter.json").write_text(json.dumps(meta))
    return target, store, folder, samples


def reference(drafter, target, samples, K):
    """Per sample, per row, per step, with plain loops."""
    embed, head, _ = read_target_tensors(target)
    embed, head = embed.float(), head.float()
    scored, correct = [0] * K, [0] * K
    chains, chain_ok = 0, [0] * K
    for ids, mask, aux, fin in samples:
        T = len(ids)
        x = torch.as_tensor(ids)[None].long()
        with torch.no_grad():
            logits = drafter(aux[None], x, lambda t: torch.nn.functional.embedding(t, embed), K)
        greedy = (fin @ head.T).argmax(-1)
        right = {}
        for k in range(K):
            for t in range(T):
                if t + k + 2 < T and mask[t + k + 2]:
                    d = int(drafter.draft_to_target(logits[k][0, t].argmax()))
                    right[t, k] = d == int(greedy[t + k + 1])
                    scored[k] += 1
                    correct[k] += right[t, k]
        for t in range(T):
            if all((t, k) in right for k in range(K)):
                chains += 1
                for k in range(K):
                    if not all(right[t, j] for j in range(k + 1)):
                        break
                    chain_ok[k] += 1
    return scored, correct, chains, chain_ok


def test_evaluate_stores_matches_a_per_sample_loop(setup):
    target, store, folder, samples = setup
    drafter, meta = load_drafter(folder)
    K = 3
    m = evaluate_stores(drafter, meta["aux_layer_ids"], target, [store], steps=K, batch_size=3)
    scored, correct, chains, chain_ok = reference(drafter, target, samples, K)
    assert m.scored == scored and m.chains == chains
    assert m.acc == pytest.approx([c / s for c, s in zip(correct, scored, strict=True)])
    assert m.chain == pytest.approx([c / chains for c in chain_ok])
    assert m.samples == len(samples)
    embed, head, _ = read_target_tensors(target)
    rows = []
    for ids, mask, aux, fin in samples:
        with torch.no_grad():
            x = torch.as_tensor(ids)[None].long()
            logits = drafter(aux[None], x, lambda t: F.embedding(t, embed.float()), 1)[0][0]
        greedy = (fin @ head.float().T).argmax(-1).tolist()
        draft0 = drafter.draft_to_target(logits.argmax(-1)).tolist()
        rows.append((ids.tolist(), mask.tolist(), greedy, draft0))
    on, on_right, off, off_right = copy_split_reference(rows)
    assert m.lookup_share == pytest.approx(on / (on + off))
    assert m.acc0_other_rows == pytest.approx(off_right / off)
    assert on == 0 or m.acc0_lookup_rows == pytest.approx(on_right / on)
    assert m.to_dict()["lookup_rows"]["share"] == m.lookup_share


def copy_split_reference(rows):
    """(scored step-0 rows the lookup names, of those right, right elsewhere, elsewhere) by a
    plain scan per row; ``rows`` = (ids, mask, greedy, draft0) per sample, row t's step-0 draft
    names token t+2, which the target's greedy token after t+1 is."""
    on = on_right = off = off_right = 0
    for ids, mask, greedy, draft0 in rows:
        for t in range(len(ids) - 2):
            if not mask[t + 2]:
                continue
            right = draft0[t] == greedy[t + 1]
            if scan_lookup(list(ids[: t + 2])) == greedy[t + 1]:
                on, on_right = on + 1, on_right + right
            else:
                off, off_right = off + 1, off_right + right
    return on, on_right, off, off_right


def test_the_lookup_split_of_acc0_against_a_plain_scan():
    # phrases said over and over, with slips: the lookup names the greedy token on many rows
    g = torch.Generator().manual_seed(0)
    lengths = [23, 49, 2, 41]
    B, T = len(lengths), max(lengths)
    ids = torch.randint(0, 8, (B, 5), generator=g).repeat(1, 10)[:, :T]
    slips = torch.rand(B, T, generator=g) < 0.15
    ids[slips] = torch.randint(0, 8, (int(slips.sum()),), generator=g)
    greedy = torch.roll(ids, -1, 1)  # mostly the text's next token, as in regenerated data
    noise = torch.rand(B, T, generator=g) < 0.3
    greedy[noise] = torch.randint(0, 8, (int(noise.sum()),), generator=g)
    mask = torch.rand(B, T, generator=g) > 0.2
    for b, n in enumerate(lengths):
        mask[b, n:] = False
    drafts = [torch.randint(0, 8, (B, T), generator=g) for _ in range(2)]
    c = count_acceptance(drafts, greedy, mask, lookup=lookup_guesses(ids, lengths))
    rows = [(ids[b, :n].tolist(), mask[b, :n].tolist(), greedy[b, :n].tolist(),
             drafts[0][b, :n].tolist()) for b, n in enumerate(lengths)]  # fmt: skip
    on, on_right, off, off_right = copy_split_reference(rows)
    assert on > 20 and off > 20  # both sides are exercised
    assert (c.lookup_rows, c.lookup_rows_correct) == (on, on_right)
    m = metrics(c + count_acceptance(drafts, greedy, mask))  # a batch without the split adds 0
    assert m.lookup_share == pytest.approx(on / (on + off) / 2)  # its rows count in scored[0]
    m = metrics(c)
    assert m.lookup_share == pytest.approx(on / (on + off))
    assert m.acc0_lookup_rows == pytest.approx(on_right / on)
    assert m.acc0_other_rows == pytest.approx(off_right / off)


def test_greedy_tokens_is_the_full_vocab_argmax():
    g = torch.Generator().manual_seed(1)
    final, head = torch.randn(2, 5, 8, generator=g), torch.randn(30, 8, generator=g)
    assert torch.equal(greedy_tokens(final, head, chunk=3), (final @ head.T).argmax(-1))


def test_stores_of_other_layers_are_refused(setup):
    target, store, folder, _ = setup
    drafter, _ = load_drafter(folder)
    with pytest.raises(AcceptanceError, match=r"aux layers \[1, 2, 4\].*trained on \[0, 1, 2\]"):
        evaluate_stores(drafter, [0, 1, 2], target, [store], steps=2)


def test_missing_drafter_names_the_fix(tmp_path):
    with pytest.raises(AcceptanceError, match="run the train stage"):
        load_drafter(tmp_path)
