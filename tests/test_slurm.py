"""Cluster requests from the config, and the default workflow through profiles/slurm on a real
single-node SLURM started for the test.

The SLURM test checks, from SLURM's own records rather than Snakemake's word: every job of the
plan (all but the local ones) became a SLURM job that completed (the job completion log), with
the partition, GPUs, CPUs, memory and time limit that config and rules ask for (scontrol show
job, kept for MinJobAge); and the cluster's daemons, and only they, are stopped afterwards.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from slurm.cluster import Cluster, ClusterError, alive, parse_jobcomp, unavailable_reason
from slurm.workflow import CONFIGS, REPO, Workflow

from eyrie.common.resources import ResourcesError, check_rule_names, requests

# The test cluster has no accounting database: poll with squeue, submit without an account,
# and poll soon after submission (the plugin's default first poll comes after 40 s).
CI_FLAGS = (
    "--slurm-status-command", "squeue",
    "--slurm-no-account",
    "--slurm-init-seconds-before-status-checks", "2",
    "--jobs", "4",
)  # fmt: skip
# GPU jobs under tests/configs/small.yaml (capture on the CPU; train and evaluate on "auto").
GPU_RULES = {"train_drafter", "evaluate_acceptance", "evaluate_speculate"}
# Jobs that run where snakemake runs: the target rule, and evaluate_sglang, which without SGLang
# only records "not run" (`localrule:` in rules/evaluate.smk).
LOCAL_RULES = {"all", "evaluate_sglang"}


SITE = {
    "capture": {"device": "cpu", "backend": "hf"},
    "train": {"device": "auto", "processes": 4},
    "evaluate": {"device": "auto"},
    "validate": {"spot_check_samples": 4},
    "resources": {
        "default": {"mem_mb": 4000, "runtime": 60, "partition": "cpu", "account": "proj"},
        "gpu": {"gpu_model": "h200", "cpus": 16, "mem_mb": 200000, "partition": "gpu"},
        "rules": {"train_drafter": {"runtime": 720, "extra": "--qos=long"}},
    },
}


def test_cpu_rule_takes_the_default_and_keeps_what_it_declares():
    got = requests(SITE, "extract", {"mem_mb": 8000, "runtime": 120, "threads": 2})
    assert got == {
        "mem_mb": 8000,
        "runtime": 120,
        "slurm_partition": "cpu",
        "slurm_account": "proj",
        "gpu": 0,
    }


def test_gpu_rule_takes_the_gpu_level_over_its_own_and_its_rule_level_last():
    got = requests(SITE, "train_drafter", {"mem_mb": 8000, "gpu": 4})
    assert got == {
        "gpu": 4,  # one per training process
        "gpu_model": "h200",
        "cpus_per_task": 16,
        "mem_mb": 200000,
        "runtime": 720,
        "slurm_partition": "gpu",
        "slurm_account": "proj",
        "slurm_extra": "--qos=long",
    }


def test_null_inherits_and_rule_level_gpu_switches_gpus_on_and_off():
    cfg = {
        **SITE,
        "resources": {
            **SITE["resources"],
            "gpu": {"gpu": None, "partition": None, "gpu_model": "a100"},
            "rules": {"validate_summary": {"gpu": 2}, "evaluate_speculate": {"gpu": 0}},
        },
    }
    gpu_job = requests(cfg, "evaluate_acceptance", {"gpu": 1})
    assert gpu_job["slurm_partition"] == "cpu"  # null inherits
    assert gpu_job["gpu"] == 1
    on = requests(cfg, "validate_summary")
    assert (on["gpu"], on["gpu_model"]) == (2, "a100")
    off = requests(cfg, "evaluate_speculate", {"gpu": 1})
    assert off["gpu"] == 0 and "gpu_model" not in off and "cpus_per_task" not in off


def test_default_gpu_raises_a_gpu_jobs_count_and_leaves_cpu_jobs_alone():
    cfg = {"resources": {"default": {"gpu": 2}}}
    assert requests(cfg, "extract", {"gpu": 1})["gpu"] == 2
    assert requests(cfg, "train_drafter", {"gpu": 4})["gpu"] == 4
    assert requests(cfg, "extract", {"gpu": 0})["gpu"] == 0
    assert requests(cfg, "report")["gpu"] == 0


# Overrides of tests/configs/small.yaml (capture on the CPU; train and evaluate on "auto"), and
# the GPUs each rule's own `resources:` asks for under them.
GPU_CASES = {
    "small": (
        {"train": {"processes": 4}},
        {
            "extract": 0, "validate_shard": 0, "train_drafter": 4, "evaluate_acceptance": 1,
            "evaluate_speculate": 1, "evaluate_sglang": 0, "evaluate_baselines": 0,
            "prepare_dataset": 0, "export_drafter": 0, "report": 0,
        },
    ),
    "cuda": (
        {
            "capture": {"device": "cuda"},
            "regenerate": {"enabled": True, "device": "cuda"},
            "train": {"device": "cpu", "processes": 4},
            "evaluate": {"device": "cpu"},
        },
        {
            "extract": 1, "validate_shard": 1, "regenerate": 1, "train_drafter": 0,
            "evaluate_acceptance": 0, "evaluate_speculate": 0,
        },
    ),
    "sglang": (
        {"capture": {"backend": "sglang"}, "regenerate": {"enabled": True, "backend": "sglang"}},
        {"extract": 1, "validate_shard": 0, "regenerate": 1, "evaluate_sglang": 1},
    ),
    "server_url": (
        {
            "capture": {"device": "cuda"},
            "validate": {"spot_check_samples": 0},
            "regenerate": {"enabled": True, "backend": "sglang", "sglang": {"url": "http://h"}},
        },
        {"extract": 1, "validate_shard": 0, "regenerate": 0},
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_which_jobs_ask_for_gpus(case, tmp_path):
    """Each rule's `resources:` (rules/*.smk) says how many GPUs its jobs take under a config."""
    change, want = GPU_CASES[case]
    wf = Workflow.scratch(tmp_path / "wd", CONFIGS / "small.yaml", change)
    got = {j.rule: int(j.resources["gpu"]) for j in wf.plan()}
    assert {rule: got.get(rule) for rule in want} == want


def test_a_misspelled_rule_is_an_error_naming_it():
    check_rule_names(SITE, ["train_drafter", "extract"])
    with pytest.raises(ResourcesError, match="trian_drafter"):
        check_rule_names({"resources": {"rules": {"trian_drafter": {}}}}, ["train_drafter"])


def test_the_workflow_applies_config_requests_and_set_resources_wins(tmp_path):
    """Through Snakemake itself (a dry run): rules/resources.smk, declared values, overrides."""
    wf = Workflow.scratch(
        tmp_path / "wd",
        CONFIGS / "small.yaml",
        REPO / "tests" / "ci-slurm.yaml",
        {"capture": {"device": "cuda"}, "resources": {"rules": {"report": {"runtime": 5}}}},
    )
    plan = {j.rule: j.resources for j in wf.plan("--set-resources", "validate_shard:runtime=7")}
    assert plan["extract"]["gpu"] == "1" and plan["extract"]["gpu_model"] == "fake"
    assert plan["extract"]["slurm_partition"] == "gpu"
    assert plan["validate_shard"]["runtime"] == "7"  # --set-resources over the config
    assert plan["prepare_dataset"]["slurm_partition"] == "debug"
    assert plan["prepare_dataset"]["gpu"] == "0" and "gpu_model" not in plan["prepare_dataset"]
    assert plan["report"]["runtime"] == "5"
    assert plan["export_drafter"]["mem_mb"] == "1000"


def _skip_reason() -> str | None:
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return "snakemake-executor-plugin-slurm is not installed (pip install '.[test]')"
    return unavailable_reason()


@pytest.mark.slurm
def test_cluster_stop_ends_only_its_daemons():
    """stop() ends exactly the PIDs start() recorded, and removes its slurm.conf link."""
    if reason := _skip_reason():
        pytest.skip(reason)
    root = _cluster_root()
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        with Cluster(root) as c:
            pids = dict(c.pids)
            assert set(pids) == {"munged", "slurmctld", "slurmd"}
            assert all(alive(p, root) for p in pids.values())
        assert not any(alive(p, root) for p in pids.values())
        assert bystander.poll() is None
        assert not Path("/etc/slurm/slurm.conf").exists()
    finally:
        bystander.kill()
        bystander.wait()
        shutil.rmtree(root, ignore_errors=True)


def _cluster_root() -> Path:
    """munged wants every folder above its socket open to all: pytest's tmp_path is not."""
    return Path(tempfile.mkdtemp(prefix="eyrie-slurm-"))


@pytest.fixture
def cluster():
    if reason := _skip_reason():
        pytest.skip(reason)
    root = _cluster_root()
    c = Cluster(root)
    try:
        c.start()
    except ClusterError:
        c.stop()
        raise
    yield c
    pids = dict(c.pids)
    c.stop()
    left = [name for name, pid in pids.items() if alive(pid, root)]
    shutil.rmtree(root, ignore_errors=True)
    assert not left, f"daemons still running after stop: {left}"


def _jobs_by_id(cluster: Cluster) -> dict[str, dict[str, str]]:
    """Every job slurmctld still knows (all of this run's: MinJobAge is 10 minutes)."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o"],
        env=cluster.env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {j["JobId"]: j for j in parse_jobcomp(out)}


def _comment(rule: str, wildcards: dict[str, str]) -> str:
    """The plugin's job comment: rule_NAME[_wildcards_V1_V2...]."""
    return f"rule_{rule}" + (f"_wildcards_{'_'.join(wildcards.values())}" if wildcards else "")


@pytest.mark.slurm
@pytest.mark.slow
def test_default_workflow_through_slurm(cluster, tmp_path, capsys):
    wf = Workflow.scratch(
        tmp_path / "run", CONFIGS / "small.yaml", REPO / "tests" / "ci-slurm.yaml"
    )
    wf.env = cluster.env()
    plan = wf.plan(*CI_FLAGS, profile="slurm")
    planned = [j for j in plan if j.rule not in LOCAL_RULES]
    assert {j.rule for j in planned} >= {"prepare_dataset", "extract", "validate_shard"}
    assert sum(j.rule == "extract" for j in planned) == 4, "2 splits x 2 shards"
    assert GPU_RULES <= {j.rule for j in planned}

    # the plugin's queries for job states at most 1 s apart (tests/slurm/fast_poll.py): it
    # would wait up to ~20 s to see each step of the DAG end
    wf.main = (str(REPO / "tests" / "slurm" / "fast_poll.py"),)
    start = time.monotonic()
    log = wf.run(*CI_FLAGS, profile="slurm", timeout=540)
    took = time.monotonic() - start
    with capsys.disabled():
        print(f"\n[test_slurm] {len(planned)} SLURM jobs, workflow took {took:.0f} s")

    # Nothing ran on the submitting machine but the target rule and declared local rules.
    local = re.findall(r"^localrule (\w+):", log, re.M)
    assert sorted(local) == sorted(j.rule for j in plan if j.rule in LOCAL_RULES), local
    assert wf.path("results/report/summary.md").is_file()

    # Every planned job is one completed SLURM job, per the job completion log.
    done = parse_jobcomp(cluster.jobcomp.read_text())
    assert len(done) == len(planned), f"{len(done)} SLURM jobs for {len(planned)} planned"
    assert {j["JobState"] for j in done} == {"COMPLETED"}, done
    assert {j["ExitCode"] for j in done} == {"0:0"}
    details = _jobs_by_id(cluster)
    assert set(details) == {j["JobId"] for j in done}
    by_comment = Counter(d["Comment"] for d in details.values())
    assert by_comment == Counter(_comment(j.rule, j.wildcards) for j in planned)

    # Requests: what Snakemake resolved for each job is what SLURM was asked for.
    want = {_comment(j.rule, j.wildcards): j for j in planned}
    for d in details.values():
        job = want[d["Comment"]]
        assert d["MinMemoryNode"] == f"{job.resources['mem_mb']}M", (d["Comment"], d)
        cpus = int(job.resources.get("cpus_per_task", job.threads))
        assert d["NumCPUs"] == str(cpus), (d["Comment"], d["NumCPUs"], cpus)
        minutes = int(job.resources["runtime"])
        assert d["TimeLimit"] == f"{minutes // 60:02d}:{minutes % 60:02d}:00", d["Comment"]
        if job.rule in GPU_RULES:
            assert d["Partition"] == "gpu" and d.get("TresPerJob") == "gres:gpu:fake:1", d
        else:
            assert d["Partition"] == "debug" and "gpu" not in d.get("TresPerJob", ""), d
