"""A store half deleted (a kill while Snakemake removes it before a rerun, or by hand) is found
and redone by the next run, and validation then passes."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest
import yaml
from slurm.workflow import CONFIGS, REPO, Workflow

from eyrie.store.shard import ShardReader

pytestmark = pytest.mark.slow

STORE = "results/store/train/shard-000.zarr"
ERRORS = "results/store/train/shard-000.errors.csv"
REPORT = "results/validate/train/shard-000.json"

# Snakemake, killed (os._exit, as by SIGKILL) after its own deletion of the old store has
# removed part of it: the commit record and the sample ids, and (EYRIE_LOSE_TIMESTAMP=1)
# Snakemake's own timestamp file, which makes the store look newer than what was made from it.
KILLED_WHILE_DELETING = textwrap.dedent(
    """
    import os, shutil, sys
    real = shutil.rmtree
    def rmtree(path, *args, **kwargs):
        p = str(path)
        if p.endswith(".zarr") and os.path.isfile(os.path.join(p, "commit.json")):
            os.unlink(os.path.join(p, "commit.json"))
            real(os.path.join(p, "sample_id"))
            if os.environ.get("EYRIE_LOSE_TIMESTAMP") == "1":
                os.unlink(os.path.join(p, ".snakemake_timestamp"))
            os._exit(137)
        return real(path, *args, **kwargs)
    shutil.rmtree = rmtree
    from snakemake.cli import main
    sys.argv[0] = "snakemake"
    main()
    """
)


@pytest.fixture(scope="module")
def extracted(small_run) -> Workflow:
    """The train shard extracted and validated by the workflow of tests/configs/small.yaml: the
    session's complete run of it (tests/conftest.py, shared with tests/test_reruns.py; each
    test here works on a copy, and runs and plans only for REPORT)."""
    assert small_run.configfiles == [(CONFIGS / "small.yaml").resolve()]
    assert _own_errors(small_run) == {}
    return small_run


@pytest.fixture
def copy(extracted, tmp_path) -> Workflow:
    root = tmp_path / "wd"
    shutil.copytree(extracted.root, root, symlinks=True)
    return Workflow(root=root, configfiles=list(extracted.configfiles))


def _own_errors(wf: Workflow) -> dict:
    report = json.loads(wf.path(REPORT).read_text())
    return {k: v for k, v in report["error_counts"].items() if not k.startswith("extract:")}


@pytest.mark.parametrize("lose_timestamp", [True, False])
def test_kill_during_snakemakes_deletion_of_a_store_is_redone(copy, lose_timestamp):
    script = copy.root / "killed_snakemake.py"
    script.write_text(KILLED_WHILE_DELETING)
    cmd = copy.command("--cores", "1", "--forcerun", "extract", "--", REPORT)
    assert cmd[1:3] == ["-m", "snakemake"]
    env = {**os.environ, "EYRIE_LOSE_TIMESTAMP": str(int(lose_timestamp))}
    proc = subprocess.run([sys.executable, str(script), *cmd[3:]], cwd=copy.root, env=env)
    assert proc.returncode == 137
    assert copy.path(STORE).is_dir() and not copy.path(f"{STORE}/commit.json").exists()

    copy.run("--unlock")
    log = copy.run("--cores", "1", REPORT)  # the profile passes --rerun-incomplete
    if not lose_timestamp:
        # What was made from the store is still current, so nothing needs the store now: the
        # run says what happened and how to redo it.
        assert "localrule extract:" not in log
        hint = f"Eyrie: shard store {STORE} is half deleted ({ERRORS}, {STORE}/commit.json"
        assert hint in log, log[-3000:]
        redo = log.split("to redo it now run: ", 1)[1].splitlines()[0]
        # the user's own Snakefile, folder and config files, so it runs as printed from anywhere
        assert redo.startswith("snakemake --cores 1 --snakefile ")
        assert redo.endswith(f"--forcerun {STORE} -- {STORE}")
        assert all(str(c) in redo for c in copy.configfiles), redo
        done = subprocess.run(
            [sys.executable, "-m", *shlex.split(redo)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        log = done.stdout + done.stderr
    assert "localrule extract:" in log, log[-3000:]
    assert len(ShardReader(copy.path(STORE))) > 0  # complete and readable again
    log = copy.run("--cores", "1", REPORT)
    assert "is half deleted" not in log
    assert _own_errors(copy) == {}
    assert copy.plan(REPORT) == []


@pytest.mark.parametrize("lost", [["commit.json", "aux_hidden"], ["sample_id", "offsets"]])
def test_eyrie_extract_redoes_a_half_deleted_store_and_validate_then_passes(copy, lost):
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    for section, values in yaml.safe_load((CONFIGS / "small.yaml").read_text()).items():
        cfg[section] = {**cfg.get(section, {}), **values}
    (copy.root / "merged.yaml").write_text(yaml.safe_dump(cfg))
    for name in lost:
        path = copy.path(f"{STORE}/{name}")
        shutil.rmtree(path) if path.is_dir() else path.unlink()

    def eyrie(*args):
        cmd = [sys.executable, "-m", "eyrie.cli.main", *args, "--config", "merged.yaml"]
        return subprocess.run(cmd, cwd=copy.root, capture_output=True, text=True)

    before = eyrie("validate", "--split", "train", "--shard", "0")
    assert before.returncode == 1
    assert "half deleted" in copy.path(REPORT).read_text()
    assert f"rm -rf {STORE} {ERRORS}" in before.stderr
    assert "eyrie extract --config merged.yaml --split train --shard 0" in before.stderr
    done = eyrie("extract", "--split", "train", "--shard", "0", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert len(ShardReader(copy.path(STORE))) > 0
    after = eyrie("validate", "--split", "train", "--shard", "0")
    assert after.returncode == 0, after.stderr
    assert _own_errors(copy) == {}
