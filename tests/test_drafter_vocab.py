"""The draft vocabulary: top-N by loss-mask frequency, d2t/t2d properties, counting from stores."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from eyrie.store.shard import ShardWriter
from eyrie.train import vocab as draft_vocab
from eyrie.train.vocab import VocabError, build, check_maps, count_tokens


def test_build_takes_top_n_ties_to_lower_id():
    counts = torch.tensor([5, 0, 9, 5, 1, 9, 0, 5])
    v = build(counts, 4)
    # 9 (ids 2, 5), then 5 (ids 0, 3, 7): the tie at 5 keeps the lower ids 0 and 3
    assert v.draft_tokens.tolist() == [0, 2, 3, 5]
    assert v.d2t.tolist() == [0, 1, 1, 2]
    assert v.t2d.tolist() == [True, False, True, True, False, True, False, False]
    assert v.coverage() == pytest.approx(28 / 34)


def test_maps_properties_on_random_counts():
    g = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 50, (500,), generator=g)
    v = build(counts, 120)
    d2t, t2d = v.d2t, v.t2d
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert int(t2d.sum()) == 120
    target = d2t + torch.arange(120)
    assert torch.equal(target, torch.nonzero(t2d).flatten())
    assert bool((d2t >= 0).all()) and bool((d2t[1:] >= d2t[:-1]).all())
    assert int(target.max()) < 500
    kept_min = int(counts[v.draft_tokens].min())
    assert int(counts[~t2d].max()) <= kept_min  # nothing left out is more frequent
    assert check_maps(d2t, t2d, 500) == []


def test_unseen_tokens_fill_a_large_vocabulary():
    counts = torch.zeros(10, dtype=torch.int64)
    counts[7] = 3
    v = build(counts, 4)
    assert v.draft_tokens.tolist() == [0, 1, 2, 7]
    with pytest.raises(VocabError, match="1..10"):
        build(counts, 11)


def test_check_maps_finds_each_inconsistency():
    v = build(torch.arange(20), 5)
    d2t, t2d = v.d2t, v.t2d
    assert check_maps(d2t, t2d, 20) == []
    assert any(
        "marks 4" in p
        for p in check_maps(d2t, t2d.clone().index_fill(0, v.draft_tokens[:1], False), 20)
    )
    moved = t2d.clone()
    moved[v.draft_tokens[0]] = False
    moved[0] = True
    assert any("exactly" in p for p in check_maps(d2t, moved, 20))
    assert any("outside" in p for p in check_maps(d2t + 1, t2d, 20))
    assert any(
        "same target token" in p
        for p in check_maps(torch.zeros(5, dtype=torch.int64) - torch.arange(5), t2d, 20)
    )
    assert any("int64" in p for p in check_maps(d2t.float(), t2d, 20))
    assert any("bool" in p for p in check_maps(d2t, t2d.long(), 20))
    assert any("entries" in p for p in check_maps(d2t, t2d, 21))


def test_count_tokens_counts_loss_mask_positions_only(tmp_path):
    rng = np.random.default_rng(0)
    want = Counter()
    paths = []
    for s in range(2):
        path = tmp_path / f"shard-{s}.zarr"
        with ShardWriter(path, hidden_size=4, aux_layer_ids=[0], provenance={}) as w:
            for i in range(5):
                T = int(rng.integers(3, 12))
                ids = rng.integers(0, 30, T)
                mask = rng.random(T) < 0.5
                want.update(ids[mask].tolist())
                w.append(f"{s}-{i}", ids, mask, torch.zeros(T, 1, 4), torch.zeros(T, 4))
            w.finish()
        paths.append(path)
    counts = count_tokens(paths, 30)
    assert counts.tolist() == [want[i] for i in range(30)]
    with pytest.raises(VocabError, match="another tokenizer"):
        count_tokens(paths, 20)


def test_save_and_load_round_trip(tmp_path):
    v = build(torch.randint(0, 9, (64,)), 16)
    path = tmp_path / "v" / "vocab.safetensors"
    summary = draft_vocab.save(v, path, {"note": "x"})
    assert summary["draft_vocab_size"] == 16 and (tmp_path / "v" / "vocab.json").is_file()
    back = draft_vocab.load(path)
    assert torch.equal(back.draft_tokens, v.draft_tokens) and torch.equal(back.counts, v.counts)
    from safetensors.torch import load_file, save_file

    t = load_file(str(path))
    t["t2d"] = torch.zeros_like(t["t2d"])
    save_file(t, str(path))
    with pytest.raises(VocabError, match="inconsistent"):
        draft_vocab.load(path)
