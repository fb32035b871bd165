"""The training loss, its alignment, the batch order and a short end-to-end run."""

from __future__ import annotations

import csv
import json

import pytest
import torch
import torch.nn.functional as F
import yaml
from test_train_setup import AUX, make_setup, tiny_settings

from eyrie.common.config import SCHEMA_PATH
from eyrie.train.data import GlobalBatches
from eyrie.train.distributed import Dist
from eyrie.train.loss import soft_cross_entropy, step_counts, ttt_terms, weighted_loss
from eyrie.train.optim import lr_lambda
from eyrie.train.settings import DEFAULTS, TrainError
from eyrie.train.trainer import train


def test_soft_cross_entropy_matches_torch():
    torch.manual_seed(0)
    logits = torch.randn(6, 10)
    p = torch.softmax(torch.randn(6, 10), -1)
    want = F.cross_entropy(logits, p, reduction="none")  # probability targets
    torch.testing.assert_close(soft_cross_entropy(logits, p), want)
    hard = torch.randint(0, 10, (6,))
    one_hot = F.one_hot(hard, 10).float()
    torch.testing.assert_close(
        soft_cross_entropy(logits, one_hot), F.cross_entropy(logits, hard, reduction="none")
    )


def brute_force_terms(logits, probs, greedy, mask, d2t):
    """ttt_terms by explicit loops: row t of step k is scored on token t+k+2 via target t+k+1."""
    B, T = mask.shape
    K = len(logits)
    ce, correct, chain = [0.0] * K, [0] * K, [0] * K
    for b in range(B):
        for t in range(T):
            alive = t + 2 < T and bool(mask[b, t + 2])
            for k in range(K):
                if t + k + 2 >= T or not mask[b, t + k + 2]:
                    alive = False
                    continue
                lp = torch.log_softmax(logits[k][b, t].double(), -1)
                ce[k] += float(-(probs[b, t + k + 1].double() * lp).sum())
                d = int(logits[k][b, t].argmax())
                hit = d + int(d2t[d]) == int(greedy[b, t + k + 1])
                correct[k] += hit
                alive = alive and hit
                chain[k] += alive
    return ce, correct, chain


def test_ttt_terms_alignment_against_loops():
    torch.manual_seed(1)
    B, T, N, K = 3, 9, 5, 4  # target vocabulary of 12
    tokens = torch.tensor([0, 2, 3, 7, 11])
    d2t = tokens - torch.arange(N)
    greedy = tokens[torch.randint(0, N, (B, T))]
    greedy[0, 4] = 1  # a target token outside the draft vocabulary is never hit
    logits = [torch.randn(B, T, N) for _ in range(K)]
    for k in range(K):  # make about half of the drafts right
        right = torch.searchsorted(tokens, greedy.clamp(max=11)).clamp(max=N - 1)
        hit = torch.rand(B, T) < 0.6
        lk = logits[k].clone()
        for b in range(B):
            for t in range(T - k - 1):
                if hit[b, t]:
                    lk[b, t, right[b, t + k + 1]] = 9.0
        logits[k] = lk
    probs = torch.softmax(torch.randn(B, T, N), -1)
    mask = torch.rand(B, T) < 0.8
    mask[2, 6:] = False  # a short sample: padding at the end
    terms = ttt_terms(logits, probs, greedy, mask, d2t)
    ce, correct, chain = brute_force_terms(logits, probs, greedy, mask, d2t)
    torch.testing.assert_close(terms["ce"].double(), torch.tensor(ce, dtype=torch.float64))
    assert terms["correct"].tolist() == correct
    assert terms["chain"].tolist() == chain
    assert float(terms["chain_starts"]) == float(mask[:, 2:].sum())
    counts = step_counts(mask, K)
    assert counts.tolist() == [float(mask[:, k + 2 :].sum()) for k in range(K)]


def test_weighted_loss_splits_over_processes():
    ce = torch.tensor([4.0, 3.0, 0.0])  # no scored row at step 2: its sum is 0
    counts = torch.tensor([8.0, 6.0, 0.0], dtype=torch.float64)
    whole = weighted_loss(ce, counts, 0.8, 1)
    assert float(whole) == pytest.approx(4 / 8 + 0.8 * 3 / 6)
    halves = [weighted_loss(c, counts, 0.8, 2) for c in (ce * 0.25, ce * 0.75)]
    assert float(sum(halves) / 2) == pytest.approx(float(whole))  # what DDP's mean gives


def test_global_batches_same_for_any_world_size_and_resume():
    lengths = torch.randint(5, 300, (37,)).tolist()
    one = GlobalBatches(lengths, 8, seed=3, start=0, stop=12, d=Dist())
    two = [GlobalBatches(lengths, 8, 3, 0, 12, Dist(rank=r, world=2)) for r in range(2)]
    batches = list(one)
    for step, (a, b) in enumerate(zip(*two, strict=True)):
        assert sorted(a + b) == sorted(batches[step])
        assert not set(a) & set(b)
    steps_per_epoch = GlobalBatches.steps_per_epoch(37, 8)
    epoch0 = [i for b in batches[:steps_per_epoch] for i in b]
    # each sample at most once per epoch
    assert len(epoch0) == len(set(epoch0)) == steps_per_epoch * 8
    assert all(lengths[x] <= lengths[y] for b in batches for x, y in zip(b, b[1:], strict=False))
    resumed = list(GlobalBatches(lengths, 8, 3, start=5, stop=12, d=Dist()))
    assert resumed == batches[5:]
    other_seed = list(GlobalBatches(lengths, 8, 4, 0, 12, Dist()))
    assert other_seed != batches
    with pytest.raises(TrainError, match="smaller than"):
        GlobalBatches(lengths, 1, 0, 0, 1, Dist(rank=0, world=2))


def test_lr_schedule_warms_up_then_decays_to_floor():
    f = lr_lambda(4, 20, 0.1)
    values = [f(s) for s in range(21)]
    assert values[:4] == [0.25, 0.5, 0.75, 1.0]
    assert values[4] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(values[4:], values[5:], strict=False))
    assert values[20] == pytest.approx(0.1)


def test_schema_defaults_are_the_trainer_defaults():
    schema = yaml.safe_load(SCHEMA_PATH.read_text())["properties"]["train"]["properties"]
    for key, sub in schema.items():
        if key == "drafter":
            continue
        if key == "dflash":  # filled key by key
            assert DEFAULTS[key] == {k: v["default"] for k, v in sub["properties"].items()}
            continue
        assert DEFAULTS[key] == sub["default"], key
    assert set(schema) == set(DEFAULTS)


def read_metrics(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _numbers(rows: list[dict]) -> list[dict]:
    """The metrics rows without their timings."""
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows]


def test_train_end_to_end_and_rerun(tmp_path, monkeypatch):
    from eyrie.train import trainer

    s = make_setup(tmp_path)
    out = tmp_path / "train"
    settings = tiny_settings(max_steps=16)
    kw = dict(
        train_stores=s["train"],
        heldout_stores=s["heldout"],
        target_dir=s["target"],
        vocab_path=s["vocab"],
        out_dir=out,
        settings=settings,
        progress=False,
    )
    # As if killed after writing the drafter, before the run removed its checkpoints.
    with monkeypatch.context() as m:
        m.setattr(trainer, "finish_work", lambda work: None, raising=False)
        summary = train(**kw)
    rows = read_metrics(out / "metrics.csv")
    assert [int(r["step"]) for r in rows] == list(range(1, 17))
    first = sum(float(r["loss"]) for r in rows[:3])
    last = sum(float(r["loss"]) for r in rows[-3:])
    assert last < first, (first, last)
    held = json.loads((out / "heldout.json").read_text())
    assert len(held["acc"]) == len(held["chain_acc"]) == 3
    assert held["acc"][0] == summary["heldout"]["acc"][0]
    assert all(c <= a + 1e-12 for c, a in zip(held["chain_acc"], held["acc"], strict=True))
    meta = json.loads((out / "drafter" / "drafter.json").read_text())
    assert meta["aux_layer_ids"] == AUX and meta["target"]["num_hidden_layers"] == 6
    # checkpoints: the optimizer state reads back with weights_only=True
    ckpts = sorted((out / "work").glob("ckpt-*"))
    assert [p.name for p in ckpts] == ["ckpt-0000012", "ckpt-0000016"]  # keep_checkpoints 2
    state = torch.load(ckpts[-1] / "state.pt", weights_only=True)
    assert state["step"] == 16 and state["optimizer"]["state"]

    # the unfinished run resumes at its last checkpoint: nothing is trained again, and once
    # the drafter is written the checkpoints are gone
    again = train(**kw)
    assert again["resumed_from"] == 16
    assert read_metrics(out / "metrics.csv") == rows
    assert not list((out / "work").glob("ckpt-*"))
    # a rerun of the finished training (snakemake -R train_drafter) trains again, from step 0
    forced = train(**kw)
    assert forced["resumed_from"] == 0
    assert _numbers(read_metrics(out / "metrics.csv")) == _numbers(rows)
    # other settings: the old checkpoints are stale and training starts again
    monkeypatch.setattr(trainer, "finish_work", lambda work: None, raising=False)
    kw["settings"] = tiny_settings(max_steps=5, lr=1e-3)
    fresh = train(**kw)
    assert fresh["resumed_from"] == 0
    assert len(read_metrics(out / "metrics.csv")) == 5


def test_a_checkpoint_of_other_trainer_code_is_not_resumed(tmp_path, monkeypatch):
    from eyrie.train import checkpoint, trainer

    s = make_setup(tmp_path, n_train=8, n_heldout=2)
    out = tmp_path / "train"
    kw = dict(
        train_stores=s["train"],
        heldout_stores=[],
        target_dir=s["target"],
        vocab_path=s["vocab"],
        out_dir=out,
        settings=tiny_settings(max_steps=4, checkpoint_every=2),
        progress=False,
    )
    monkeypatch.setattr(trainer, "finish_work", lambda work: None, raising=False)  # a kill
    train(**kw)
    assert train(**kw)["resumed_from"] == 4  # same code: resumed
    monkeypatch.setattr(checkpoint, "code_digest", lambda: "a fixed trainer", raising=False)
    assert train(**kw)["resumed_from"] == 0  # other code: trained again


def test_code_digest_covers_the_code_training_runs(tmp_path):
    import shutil
    from pathlib import Path

    import eyrie
    from eyrie.train.checkpoint import code_digest

    root = tmp_path / "src"
    shutil.copytree(Path(eyrie.__file__).parent, root / "eyrie")
    base = code_digest(root)
    assert base == code_digest.__wrapped__(Path(eyrie.__file__).resolve().parent.parent)

    def edited(rel: str) -> str:
        path = root / "eyrie" / rel
        text = path.read_text()
        path.write_text(text + "\n# edited\n")
        try:
            return code_digest.__wrapped__(root)
        finally:
            path.write_text(text)

    # the trainer, what it imports, and what those import (inside functions too)
    for rel in ("train/trainer.py", "train/loss.py", "store/reader.py", "common/atomic.py"):
        assert edited(rel) != base, rel
    # stages training never runs
    for rel in ("evaluate/report.py", "export/drafter.py", "cli/train.py"):
        assert edited(rel) == base, rel


def test_train_refuses_a_vocabulary_of_another_target(tmp_path):
    from eyrie.train import vocab as draft_vocab

    s = make_setup(tmp_path, n_train=4, n_heldout=2)
    bad = tmp_path / "bad.safetensors"
    draft_vocab.save(
        draft_vocab.build(torch.ones(s["vocab_size"] + 3, dtype=torch.int64), 8), bad, {}
    )
    with pytest.raises(TrainError, match="rebuild the draft vocabulary"):
        train(
            train_stores=s["train"],
            heldout_stores=[],
            target_dir=s["target"],
            vocab_path=bad,
            out_dir=tmp_path / "t",
            settings=tiny_settings(),
            progress=False,
        )


def test_cli_names_a_missing_input_and_its_fix(tmp_path, capsys):
    from eyrie.cli.main import main

    s = make_setup(tmp_path, n_train=4, n_heldout=2)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "results": str(tmp_path / "r"),
                "target": {"path": str(s["target"])},
                "dataset": {"train": "x", "heldout": "y"},
            }
        )
    )
    args = [
        "train",
        "--config",
        str(cfg),
        "--train-stores",
        str(s["train"][0]),
        "--heldout-stores",
        "--vocab",
        str(tmp_path / "none.safetensors"),
    ]
    assert main(args) == 1
    assert "run `eyrie draft-vocab` first" in capsys.readouterr().err
