"""The commands Eyrie prints run as printed, and the stage names the docs use are rules.

A failing validate_summary prints what fixes each shard; run under another config file (another
`results`), the printed Snakemake command must carry that file, or it names a path no rule
makes. The README's stage names are what users type after `snakemake --forcerun`.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm.workflow import REPO, Workflow, parse_plan

SPLITS = ("train", "heldout")


def _rules(tmp: Path) -> set[str]:
    """The rules of the default config, and those defined for a toy or a GGUF target only."""
    gguf = tmp / "my.gguf"
    gguf.write_bytes(b"GGUF")  # listed, never read
    rules = set()
    for extra in ([], ["--config", "target={path: toy-deepseek}"],
                  ["--config", f"target={{path: {gguf}}}", f"results={tmp / 'r'}"]):  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
             "--list-rules", *extra],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout  # fmt: skip
        rules |= {line.strip() for line in out.splitlines() if re.fullmatch(r"\s*\w+\s*", line)}
    return rules


def _readme_stage_names(text: str) -> list[str]:
    """Every backticked name in the first column of the README's stage table, and every name
    of the stage diagram above it."""
    names = []
    table = text[text.index("| stage | what it does |") :].split("\n\n", 1)[0]
    for row in table.splitlines()[2:]:
        names += re.findall(r"`(\w+)`", row.split("|")[1])
    diagram = text[text.index("```\n") + 4 :].split("```", 1)[0]
    names += re.findall(r"[a-z][a-z_]*[a-z]", diagram)
    return names


def test_every_stage_name_in_the_readme_is_a_rule(tmp_path):
    rules = _rules(tmp_path)
    assert {"fetch_target", "target_identity", "build_toy_deepseek"} <= rules
    names = _readme_stage_names((REPO / "README.md").read_text())
    assert [n for n in names if n not in rules] == [], f"rules are {sorted(rules)}"
    assert {"prepare_dataset", "validate_summary", "report"} <= set(names)
    # the architecture doc's table, whose first column is "stage (rule)"
    doc = (REPO / "docs" / "architecture.md").read_text()
    table = doc[doc.index("| stage (rule) |") :].split("\n\n", 1)[0]
    for row in table.splitlines()[2:]:
        for name in re.findall(r"[a-z][a-z_*]*[a-z*]", row.split("|")[1].split("(")[0]):
            assert fnmatch.filter(rules, name), f"{name} in docs/architecture.md is no rule"


def test_rerun_of_a_workflow_run_elsewhere_names_its_snakefile_folder_and_config(tmp_path):
    from eyrie.common.rerun import Rerun

    here = Rerun.of_workflow([tmp_path / "my.yaml"], (), tmp_path / "Snakefile", tmp_path)
    assert here.targets("r/x") == "snakemake --cores 1 --configfile my.yaml -- r/x"
    away = Rerun.of_workflow(
        [tmp_path / "a b.yaml", "/etc/c.yaml"], ["results='o'"], "/src/Snakefile", tmp_path
    )
    words = shlex.split(away.targets("r/x", options=("--forcerun", "r/x")))
    assert words == [
        "snakemake", "--cores", "1", "--snakefile", "/src/Snakefile", "--directory",
        str(tmp_path), "--configfile", str(tmp_path / "a b.yaml"), "/etc/c.yaml",
        "--config", "results='o'", "--forcerun", "r/x", "--", "r/x",
    ]  # fmt: skip
    assert away.eyrie_config is None  # layered configs: the Snakemake command only


def _touch(path: Path, text: str = "", when: float = 0.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text(text)
    os.utime(path, (when, when))


def _finished_up_to_validate_shard(wf: Workflow, results: str) -> None:
    """Outputs of every job before validate_summary, newer than their inputs, so that only
    validate_summary is left to run; shard train/000's report says its store is damaged."""
    wf.plan()  # parsing records the target's identity (rules/common.smk): older than the rest
    now = time.time()
    _touch(wf.path(f"{results}/target/identity.json"), when=now - 60)
    for i, split in enumerate(SPLITS):
        for name in (f"data/{split}.jsonl", f"data/{split}.problems.csv"):
            _touch(wf.path(f"{results}/{name}"), when=now - 50 + i)
    _touch(wf.path(f"{results}/data/overlap.json"), "{}", when=now - 45)
    for name in ("verify/report.json", "verify/report.md"):
        _touch(wf.path(f"{results}/{name}"), "{}", when=now - 40)
    for split in SPLITS:
        store = wf.path(f"{results}/store/{split}/shard-000.zarr")
        store.mkdir(parents=True)
        errors = store.with_name("shard-000.errors.csv")
        _touch(errors, "line,sample_id,reason,detail\n", when=now - 30)
        _touch(store, when=now - 30)
        damaged = split == "train"
        report = {
            "split": split,
            "shard": "000",
            "store": str(store.relative_to(wf.root)),
            "errors_csv": str(errors.relative_to(wf.root)),
            "samples": 2,
            "tokens": 40,
            "errors": int(damaged),
            "error_counts": {"checksum": 1} if damaged else {},
        }
        path = wf.path(f"{results}/validate/{split}/shard-000.json")
        _touch(path, json.dumps(report), when=now - 20)


@pytest.fixture(scope="module")
def failed_summary(tmp_path_factory):
    """A workflow under its own config file (another `results`) whose validate_summary fails:
    (the workflow, the output of the failed run)."""
    root = tmp_path_factory.mktemp("advice") / "wd"
    wf = Workflow.scratch(
        root,
        {
            "results": "elsewhere",
            "target": {"path": "models/toy-llama"},
            "regenerate": {"enabled": False},
            "extract": {"shards": 1},
            "validate": {"max_errors": 0},
        },
    )
    _finished_up_to_validate_shard(wf, "elsewhere")
    assert [j.rule for j in wf.plan("--", "elsewhere/validate/summary.csv")] == ["validate_summary"]
    log = wf.run("--", "elsewhere/validate/summary.csv", check=False, timeout=300)
    assert "Error in rule validate_summary" in log, log[-3000:]
    return wf, log


def test_validation_advice_commands_run_as_printed(failed_summary):
    wf, log = failed_summary
    printed = re.findall(r"`(rm -rf [^`]*)`, then `(snakemake [^`]*)`", log)
    assert printed, log[-3000:]
    rm, command = printed[0]
    store = wf.path("elsewhere/store/train/shard-000.zarr")
    assert shlex.split(rm) == ["rm", "-rf", str(store), str(store.with_suffix(".errors.csv"))]
    words = shlex.split(command)
    assert words[words.index("--configfile") + 1] == str(wf.configfiles[0])
    assert "eyrie extract" not in log  # it would read config.yaml alone, not this run's config
    # run as printed, from another folder (the test ran Snakemake with --directory)
    elsewhere = wf.root.parent
    subprocess.run(shlex.split(rm), cwd=elsewhere, check=True)
    assert not store.exists()
    dry = [sys.executable, "-m", *words[:1], "-n", *words[1:]]
    out = subprocess.run(dry, cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    plan = parse_plan(out.stdout + out.stderr)
    assert [(j.rule, j.wildcards) for j in plan] == [
        ("extract", {"split": "train", "shard": "000"})
    ]


def test_forcerun_of_the_readme_stage_names_is_a_valid_command(failed_summary):
    wf, _ = failed_summary
    names = _readme_stage_names((REPO / "README.md").read_text())
    # one dry run for all: Snakemake refuses the whole command if any name is no rule
    plan = wf.plan("--forcerun", *names, "--", "elsewhere/validate/summary.csv")
    assert {"validate_shard", "validate_summary", "extract", "prepare_dataset"} <= {
        j.rule for j in plan
    }
