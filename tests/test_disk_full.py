"""A full disk in any stage: one message naming the file, the space free there and the fix, from
the script adapter and from the `eyrie` command alike (extraction's own, with its estimate, is
tested in tests/test_extract.py)."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from eyrie.common import atomic
from eyrie.common.adapter import rule_log
from eyrie.data.dataset import prepare

FULL = "No space left on device"


def _fsync_fails(path):
    """A write whose flush finds the disk full, as the kernel reports it (the temporary name)."""
    raise OSError(errno.ENOSPC, FULL, str(path))


def test_an_atomic_write_on_a_full_disk_names_the_output_not_the_temporary(tmp_path, monkeypatch):
    from eyrie.common.disk_full import DiskFullError, is_disk_full

    monkeypatch.setattr(atomic, "_fsync_file", _fsync_fails)
    out = tmp_path / "sub" / "out.json"
    with pytest.raises(DiskFullError) as err:
        atomic.write_json(out, {"a": 1})
    msg = str(err.value)
    assert msg.startswith(f"the disk is full: writing {out} failed ({FULL}); ")
    assert "is free on the file system mounted at /" in msg and "rerun the same command" in msg
    assert ".tmp" not in msg and is_disk_full(err.value) and err.value.filename == str(out)
    assert [p.name for p in out.parent.iterdir()] == []  # no temporary left behind


@pytest.mark.parametrize(
    "raised",
    [
        OSError(errno.ENOSPC, FULL),  # a bare write() error: no file name
        RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"),
        RuntimeError(f"Error while serializing: IoError(Os {{ code: 28, message: {FULL!r} }})"),
    ],
    ids=["oserror", "torch.save", "safetensors"],
)
def test_whatever_the_writer_raises_the_output_is_named(tmp_path, raised):
    from eyrie.common.disk_full import DiskFullError

    out = tmp_path / "model.safetensors"
    with pytest.raises(DiskFullError, match=f"writing {out} failed"):
        with atomic.atomic_path(out):
            raise raised


def _sm(tmp_path: Path) -> SimpleNamespace:
    """What a rule's script gets from Snakemake, as far as rule_log reads it."""
    out = tmp_path / "results" / "data"
    return SimpleNamespace(
        log=[str(tmp_path / "train.log")],
        threads=1,
        output=[str(out / "train.jsonl"), str(out / "train.problems.csv")],
    )


def test_prepare_dataset_on_a_full_disk_ends_with_the_message_alone(tmp_path, monkeypatch):
    src = tmp_path / "train.jsonl"
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hey"}]
    src.write_text(json.dumps({"messages": turns}) + "\n")
    monkeypatch.setattr(atomic, "_fsync_file", _fsync_fails)
    sm = _sm(tmp_path)
    with pytest.raises(SystemExit) as ended:
        with rule_log(sm, threads=False):
            prepare(src, sm.output[0], sm.output[1], split="train")
    msg = str(ended.value.code)
    assert msg.startswith(f"error: the disk is full: writing {sm.output[0]} failed ({FULL}); ")
    assert "free on the file system mounted at" in msg and "Free space there" in msg
    log = Path(sm.log[0]).read_text()
    assert msg in log and "Traceback" not in log


def test_a_bare_enospc_anywhere_in_a_stage_names_the_jobs_output(tmp_path):
    sm = _sm(tmp_path)
    with pytest.raises(SystemExit) as ended:
        with rule_log(sm, threads=False):
            raise OSError(errno.ENOSPC, FULL)  # e.g. a library's own write, no file name
    assert str(ended.value.code).startswith(
        f"error: the disk is full: writing {sm.output[0]} failed ({FULL})"
    )
    with pytest.raises(SystemExit, match="writing /data/x.bin failed"):
        with rule_log(sm, threads=False):
            raise OSError(errno.EDQUOT, "Disk quota exceeded", "/data/x.bin")
    with pytest.raises(PermissionError):  # anything else is a bug report, traceback and all
        with rule_log(sm, threads=False):
            raise PermissionError(errno.EACCES, "Permission denied", "/data/x.bin")


def test_the_eyrie_command_prints_a_full_disk_as_one_line(tmp_path, monkeypatch, capsys):
    from eyrie.cli import dataset as cli_dataset
    from eyrie.cli.main import main

    def full(args):
        raise OSError(errno.ENOSPC, FULL, str(tmp_path / "out" / "train.jsonl"))

    monkeypatch.setattr(cli_dataset, "check_dataset", full)
    assert main(["dataset", str(tmp_path / "x.jsonl")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"eyrie dataset: the disk is full: writing {tmp_path}/out/train.jsonl")
    assert len(err.strip().splitlines()) == 1
