"""Crash-safe writes: the old file survives a failed write, and no temporary file is left."""

from __future__ import annotations

import json

import pytest

from eyrie.common import atomic


def test_write_replaces_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "out.json"
    atomic.write_json(path, {"a": 1})
    atomic.write_json(path, {"a": 2}, indent=2)
    assert json.loads(path.read_text()) == {"a": 2}
    assert path.read_text().endswith("}\n")
    assert [p.name for p in path.parent.iterdir()] == ["out.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "out.json"
    atomic.write_json(path, {"ok": True})
    with pytest.raises(TypeError):
        atomic.write_json(path, {"bad": object()})  # not serialisable, no default given
    assert json.loads(path.read_text()) == {"ok": True}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_copy(tmp_path):
    src = tmp_path / "a.csv"
    src.write_text("x,y\n1,2\n")
    atomic.copy(src, tmp_path / "d" / "b.csv")
    assert (tmp_path / "d" / "b.csv").read_text() == "x,y\n1,2\n"
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["b.csv"]
