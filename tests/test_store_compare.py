"""eyrie compare-stores (eyrie/store/compare.py): a comparison that matches nothing says why."""

from __future__ import annotations

import numpy as np
from test_store import make_sample, write_store

from eyrie.store.compare import compare, render


def differing_stores(root) -> tuple:
    """Two stores of conv-0..conv-3 whose ids differ: conv-1 at position 7 (same length), conv-2
    one token longer on side b; conv-4 only in a, conv-5 only in b. conv-0 and conv-3 match."""
    a = [make_sample(i, tokens=20) for i in range(5)]
    b = [make_sample(i, tokens=20) for i in (0, 1, 2, 3, 5)]
    b[1]["input_ids"] = b[1]["input_ids"].copy()
    b[1]["input_ids"][7] += 1
    longer = make_sample(2, tokens=21)
    longer["input_ids"][:20] = b[2]["input_ids"]
    b[2] = longer
    write_store(root / "a.zarr", a)
    write_store(root / "b.zarr", b)
    return root / "a.zarr", root / "b.zarr"


def test_differing_ids_are_described(tmp_path):
    a, b = differing_stores(tmp_path)
    report = compare([a], [b])
    assert not report["ok"] and not report["input_ids_identical"]
    assert report["samples"] == 4 and report["tokens"] == 40  # conv-0 and conv-3 compared
    assert report["input_ids_differ"] == ["conv-1", "conv-2"]
    assert report["input_ids_differences"] == [
        {"sample_id": "conv-1", "tokens_a": 20, "tokens_b": 20, "first_difference": 7},
        {"sample_id": "conv-2", "tokens_a": 20, "tokens_b": 21, "first_difference": 20},
    ]
    assert report["only_in_a"] == ["conv-4"] and report["only_in_b"] == ["conv-5"]
    text = render(report)
    assert "1 samples only in a: conv-4" in text and "1 samples only in b: conv-5" in text
    assert "input_ids differ in 2 of 4 shared samples" in text
    assert "conv-1: 20 tokens in a, 20 in b, first differing token at position 7" in text
    assert "conv-2: 20 tokens in a, 21 in b, first differing token at position 20" in text


def test_no_sample_compared_renders_dashes(tmp_path):
    a = [make_sample(i, tokens=12) for i in range(3)]
    b = [{**s, "input_ids": np.asarray(s["input_ids"])[::-1].copy()} for s in a]
    write_store(tmp_path / "a.zarr", a)
    write_store(tmp_path / "b.zarr", b)
    report = compare([tmp_path / "a.zarr"], [tmp_path / "b.zarr"])
    assert report["tokens"] == 0 and not report["ok"]
    assert all(v["mean"] is None and not v["ok"] for v in report["layers"].values())
    assert report["input_ids_differ_count"] == 3 and len(report["input_ids_differences"]) == 3
    lines = render(report).splitlines()
    assert "final               -" in lines and lines[-1].startswith("FAIL")
