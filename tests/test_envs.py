"""envs/*.yaml against pyproject.toml and this interpreter's packages.

`--sdm conda` users run every rule in envs/eyrie.yaml; pip users get pyproject's ranges. Both
must mean the versions CI tests: every pin satisfies pyproject's range, every runtime dependency
is pinned, and a pin equals the installed version wherever the package is installed here.
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
ENVS = sorted((REPO / "envs").glob("*.yaml"))
# Runs the workflow rather than its jobs: a rule's job reaches the snakemake that started it.
NOT_IN_ENVS = {"snakemake"}
PIN = re.compile(r"^\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*(==|=)\s*([^\s,;]+)\s*$")


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def runtime_requirements() -> dict[str, Requirement]:
    reqs = (Requirement(r) for r in pyproject()["project"]["dependencies"])
    return {canonicalize_name(r.name): r for r in reqs}


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


@pytest.mark.parametrize("env", ENVS, ids=lambda p: p.name)
def test_pins_satisfy_pyproject(env):
    reqs, pins = runtime_requirements(), env_pins(env)
    bad = [
        f"{name}=={ver} is outside pyproject's {reqs[name].specifier}"
        for name, ver in pins.items()
        if name in reqs and ver and not reqs[name].specifier.contains(ver, prereleases=True)
    ]
    python = pins.get("python")
    requires = SpecifierSet(pyproject()["project"]["requires-python"])
    if python and not requires.contains(python):
        bad.append(f"python {python} is outside requires-python {requires}")
    assert not bad, f"{env.name}: " + "; ".join(bad)


@pytest.mark.parametrize("env", ENVS, ids=lambda p: p.name)
def test_every_runtime_dependency_is_pinned(env):
    pins = env_pins(env)
    missing = sorted(set(runtime_requirements()) - NOT_IN_ENVS - set(pins))
    loose = sorted(n for n in runtime_requirements() if pins.get(n) == "")
    assert not missing, f"{env.name} lacks {missing}: add them pinned (name==version)"
    assert not loose, f"{env.name} does not pin {loose}: pin an exact version"


@pytest.mark.parametrize("env", ENVS, ids=lambda p: p.name)
def test_pins_equal_installed_versions(env):
    """What CI tests is what conda users get; `+cpu`-style local labels are ignored."""
    wrong = []
    for name, ver in env_pins(env).items():
        if name in {"python", "pip"} or not ver:
            continue
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # not installed here: nothing to compare
        if Version(installed).public != Version(ver).public:
            wrong.append(f"{name}: pinned {ver}, installed {installed}")
    assert not wrong, f"{env.name}: update the pins or the install: " + "; ".join(wrong)


@pytest.mark.parametrize("env", ENVS, ids=lambda p: p.name)
def test_python_pin_matches_this_interpreter(env):
    pin = env_pins(env).get("python")
    if not pin:
        pytest.skip(f"{env.name} does not pin python")
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert pin == here or pin.startswith(here + "."), f"{env.name} pins python {pin}, CI {here}"


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
