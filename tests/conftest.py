"""Fixtures shared by several test files."""

from __future__ import annotations

import time

import pytest


@pytest.fixture(scope="session")
def small_run(tmp_path_factory, request):
    """One complete local run of tests/configs/small.yaml (the workflow's default target), made
    once per session for the tests that start from a finished run: tests/test_reruns.py and
    tests/test_extract_rerun.py. They work on copies of its folder (outputs, mtimes and
    .snakemake metadata preserved); nothing may change this one."""
    from slurm.workflow import CONFIGS, Workflow

    wf = Workflow.scratch(tmp_path_factory.mktemp("small-run") / "base", CONFIGS / "small.yaml")
    start = time.monotonic()
    wf.run(timeout=900)
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\n[small_run] tests/configs/small.yaml ran in {time.monotonic() - start:.0f} s")
    return wf
