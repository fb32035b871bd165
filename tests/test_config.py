"""Config validation: bad keys and values are named with the fix, in the CLI and in Snakemake."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eyrie.config import ConfigError, check, load
from eyrie.config_cli import reference

ROOT = Path(__file__).resolve().parents[1]


def default() -> dict:
    return yaml.safe_load((ROOT / "config.yaml").read_text())


def test_embedded_default_is_valid_and_defaults_fill_in():
    cfg = load(ROOT / "config.yaml")
    assert cfg["capture"]["backend"] == "hf"
    minimal = {"target": {"path": "m"}, "dataset": {"train": "a", "heldout": "b"}}
    filled = check(minimal)
    assert filled["extract"]["shards"] >= 1 and filled["validate"]["max_errors"] == 0
    assert "extract" not in minimal  # the input is not modified
    assert filled["evaluate"]["sglang"]["cuda_graph"] is True  # serving as deployed
    for mode in (False, "both"):
        cfg = load(ROOT / "config.yaml")
        cfg["evaluate"]["sglang"]["cuda_graph"] = mode
        assert check(cfg)["evaluate"]["sglang"]["cuda_graph"] == mode


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda c: c["capture"].update(backend="vllm"), ["capture.backend", "'vllm'", "'sglang'"]),
        (lambda c: c["extract"].update(shardz=2), ["extract", "shardz", "shards"]),
        (lambda c: c["dataset"].update(on_bad_input="ignore"), ["dataset.on_bad_input", "fail"]),
        (lambda c: c["extract"].update(shards=0), ["extract.shards", "minimum"]),
        (lambda c: c["capture"].update(aux_layer_ids=[1, 1]), ["capture.aux_layer_ids"]),
        (lambda c: c.pop("target"), ["target"]),
        (lambda c: c["evaluate"]["sglang"].update(cuda_graph="yes"), ["cuda_graph", "'both'"]),
    ],
)
def test_bad_config_names_the_key_and_the_allowed_values(edit, expected):
    cfg = default()
    edit(cfg)
    with pytest.raises(ConfigError) as err:
        check(cfg)
    for word in expected:
        assert word in str(err.value)


def test_every_error_is_reported_at_once():
    cfg = default()
    cfg["capture"]["backend"] = "vllm"
    cfg["dataset"]["format"] = "csv"
    message = str(pytest.raises(ConfigError, check, cfg).value)
    assert "capture.backend" in message and "dataset.format" in message


def test_not_a_mapping_and_missing_file(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "missing.yaml")


def test_snakemake_refuses_a_bad_config_naming_key_and_values(tmp_path):
    cfg = default()
    cfg["capture"]["backend"] = "vllm"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--configfile", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0
    out = run.stdout + run.stderr
    assert "'vllm' is not one of ['hf', 'sglang']" in out
    assert "['capture']['backend']" in out


def test_readme_config_reference_is_current():
    readme = (ROOT / "README.md").read_text()
    assert reference() in readme, "regenerate with: eyrie config --reference"
