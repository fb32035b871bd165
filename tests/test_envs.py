"""envs/*.yaml against pyproject.toml: two files of this repository, nothing else.

What is pinned where: pyproject.toml holds ranges (pip users, the README's commands, CI get the
newest release inside them); envs/*.yaml pin one exact version of each runtime dependency
(`--sdm conda` users). These tests compare the two files only, never with what a registry
serves today, so a new upstream release cannot break them: every pin is exact and inside
pyproject's range, every runtime dependency is pinned, and no pin names a package pyproject
does not depend on. Moving a pin is a change to envs/*.yaml, checked here when it is made.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
ENVS = sorted((REPO / "envs").glob("*.yaml"))
# Runs the workflow rather than its jobs: a rule's job reaches the snakemake that started it.
NOT_IN_ENVS = {"snakemake"}
PIN = re.compile(r"^\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*(==|=)\s*([^\s,;]+)\s*$")


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def env_pins(path: Path) -> dict[str, str]:
    """name -> pinned version, from conda dependencies and their pip: list; unpinned -> ""."""
    spec = yaml.safe_load(path.read_text()) or {}
    items: list[str] = []
    for dep in spec.get("dependencies") or []:
        if isinstance(dep, dict):
            items += dep.get("pip") or []
        else:
            items.append(str(dep))
    pins = {}
    for item in items:
        m = PIN.match(item)
        name = m.group(1) if m else re.split(r"[\s<>=!~\[]", item.strip(), maxsplit=1)[0]
        pins[canonicalize_name(name)] = m.group(3) if m else ""
    return pins


def test_there_is_an_env():
    assert ENVS, "envs/ holds no *.yaml"


def pin_problems(pins: dict[str, str], project: dict) -> list[str]:
    """Every way the pins disagree with pyproject's [project] table; empty when they agree."""
    reqs = {canonicalize_name(r.name): r for r in map(Requirement, project.get("dependencies", []))}
    bad = [
        f"{name}=={ver} is outside pyproject's {reqs[name].specifier}"
        for name, ver in pins.items()
        if name in reqs and ver and not reqs[name].specifier.contains(ver, prereleases=True)
    ]
    missing = sorted(set(reqs) - NOT_IN_ENVS - set(pins))
    if missing:
        bad.append(f"lacks {missing}: add them pinned (name==version)")
    loose = sorted(n for n in reqs if pins.get(n) == "")
    if loose:
        bad.append(f"does not pin {loose}: pin an exact version")
    stray = sorted(set(pins) - set(reqs) - {"python", "pip"})
    if stray:
        bad.append(f"pins {stray}, which pyproject does not depend on: remove them or add them")
    python = pins.get("python")
    requires = SpecifierSet(project.get("requires-python", ""))
    if not python:
        bad.append("does not pin python")
    elif not requires.contains(python):
        bad.append(f"python {python} is outside requires-python {requires}")
    return bad


# Extras the jobs' environments hold too: fetch_target reads GGUF files in them.
JOB_EXTRAS = ("gguf",)


@pytest.mark.parametrize("env", ENVS, ids=lambda p: p.name)
def test_pins_agree_with_pyproject(env):
    project = pyproject()["project"]
    extras = [r for x in JOB_EXTRAS for r in project["optional-dependencies"][x]]
    bad = pin_problems(env_pins(env), {**project, "dependencies": project["dependencies"] + extras})
    assert not bad, f"{env.name}: " + "; ".join(bad)


def test_pin_check_catches_each_disagreement():
    project = {
        "requires-python": ">=3.11",
        "dependencies": ["numpy>=2", "pyyaml>=6", "snakemake>=9"],
    }
    good = {"python": "3.11", "pip": "", "numpy": "2.4.6", "pyyaml": "6.0.3"}
    assert pin_problems(good, project) == []
    cases = {
        "outside pyproject's >=2": {**good, "numpy": "1.26.4"},
        "lacks ['pyyaml']": {k: v for k, v in good.items() if k != "pyyaml"},
        "does not pin ['pyyaml']": {**good, "pyyaml": ""},
        "pins ['tqdm']": {**good, "tqdm": "4.70.1"},
        "python 3.10 is outside": {**good, "python": "3.10"},
        "does not pin python": {k: v for k, v in good.items() if k != "python"},
    }
    for expected, pins in cases.items():
        problems = pin_problems(pins, project)
        assert len(problems) == 1 and expected in problems[0], (expected, problems)


def test_pin_parser_reads_conda_and_pip_forms(tmp_path):
    env = tmp_path / "e.yaml"
    env.write_text(
        "dependencies:\n  - python =3.11\n  - pip\n  - numpy==2.4.6\n"
        "  - pip:\n      - torch==2.13.0\n      - snakemake[reports]==9.1.0\n      - tqdm>=4\n"
    )
    assert env_pins(env) == {
        "python": "3.11",
        "pip": "",
        "numpy": "2.4.6",
        "torch": "2.13.0",
        "snakemake": "9.1.0",
        "tqdm": "",
    }
