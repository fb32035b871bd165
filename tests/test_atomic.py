"""Crash-safe writes: the old file survives a failed write, and no temporary file is left."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

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


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_outputs_get_the_umasks_mode_whatever_the_writer_made(tmp_path, umask):
    """safetensors' save_file and mkstemp write 0600, mkdtemp makes 0700: a server running
    as another user could not read an export; in place, each has what open() would give."""
    import tempfile

    import torch
    from safetensors.torch import save_file

    weights = tmp_path / "model.safetensors"
    with atomic.atomic_path(weights) as tmp:
        save_file({"w": torch.zeros(2)}, str(tmp))
    assert mode(weights) == 0o666 & ~umask  # 0644 under umask 022
    atomic.write_text(tmp_path / "a.txt", "a")
    assert mode(tmp_path / "a.txt") == 0o666 & ~umask

    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
    (folder / "sub").mkdir(mode=0o700)
    (folder / "launch.sh").write_text("#!/bin/sh\n")
    (folder / "launch.sh").chmod(0o700)
    atomic.replace_folder(folder, tmp_path / "export")
    out = tmp_path / "export"
    assert mode(out) == mode(out / "sub") == 0o777 & ~umask  # 0755 under umask 022
    assert mode(out / "model.safetensors") == 0o666 & ~umask
    assert mode(out / "launch.sh") == 0o777 & ~umask  # a script stays executable
