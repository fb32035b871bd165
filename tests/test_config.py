"""Config validation: bad keys and values are named with the fix, in the CLI and in Snakemake."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eyrie.cli.config import reference
from eyrie.common.config import ConfigError, check, load

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
        (lambda c: c["extract"].update(shard_tokens="big"), ["extract.shard_tokens", "auto"]),
        (lambda c: c["extract"].update(shard_tokens=8), ["extract.shard_tokens"]),
    ],
)
def test_bad_config_names_the_key_and_the_allowed_values(edit, expected):
    cfg = default()
    edit(cfg)
    with pytest.raises(ConfigError) as err:
        check(cfg)
    for word in expected:
        assert word in str(err.value)


def test_shard_tokens_auto_is_the_default_and_a_number_still_works():
    minimal = {"target": {"path": "m"}, "dataset": {"train": "a", "heldout": "b"}}
    assert check(minimal)["extract"]["shard_tokens"] == "auto"
    cfg = default()
    cfg["extract"]["shard_tokens"] = 4096
    assert check(cfg)["extract"]["shard_tokens"] == 4096


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


def snakemake_dry_run(tmp_path, cfg: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--configfile", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def test_snakemake_refuses_a_bad_config_naming_key_and_values(tmp_path):
    run = snakemake_dry_run(tmp_path, {"capture": {"backend": "vllm"}})
    assert run.returncode != 0
    assert "capture.backend: 'vllm' is not allowed; use one of ['hf', 'sglang']" in run.stderr


def test_snakemake_names_every_unknown_key_and_prints_no_schema(tmp_path):
    run = snakemake_dry_run(tmp_path, {"capture": {"batchsize": 4}, "trian": {"epochs": 1}})
    assert run.returncode != 0
    err = run.stderr
    assert "capture: unknown key(s) ['batchsize']; allowed keys are ['aux_layer_ids'" in err
    assert "(top level): unknown key(s) ['trian']" in err
    assert len((run.stdout + err).splitlines()) < 15, err  # not the schema
    assert "properties" not in err and "additionalProperties" not in err


def test_snakemake_stops_at_a_target_folder_without_config_json(tmp_path):
    (tmp_path / "model").mkdir()
    for path, what in ((tmp_path / "model", "has no config.json"), (tmp_path / "no", "does not")):
        run = snakemake_dry_run(tmp_path, {"target": {"path": str(path)}})
        assert run.returncode != 0
        assert f"target.path is {str(path)!r}, but the folder {path} {what}" in run.stderr
        assert "Hugging Face model folder (config.json" in run.stderr
        assert "MissingInputException" not in run.stdout + run.stderr
        assert len((run.stdout + run.stderr).splitlines()) < 10, run.stderr


@pytest.mark.parametrize("toy", ["toy-deepseek", "toy-kimi-k25"])
def test_snakemake_takes_each_toy_the_workflow_builds(tmp_path, toy):
    run = snakemake_dry_run(tmp_path, {"target": {"path": toy}})
    assert run.returncode == 0, run.stderr
    assert f"results/targets/{toy}/config.json" in run.stdout + run.stderr


def test_readme_config_reference_is_current():
    readme = (ROOT / "README.md").read_text()
    assert reference() in readme, "regenerate with: eyrie config --reference"


# ---------------------------------------------------------------------------------------------
# an override file, merged over config.yaml as Snakemake merges --configfile


def readme_overlay() -> str:
    """The override file the README's "Your own model and data" shows."""
    readme = (ROOT / "README.md").read_text()
    return readme.split("```yaml\n# my-run.yaml\n", 1)[1].split("```", 1)[0]


def snakemake_merge(base: dict, *overlays: dict) -> dict:
    """What Snakemake's config is for `--configfile` overlays over the Snakefile's configfile
    (snakemake.settings.types.ConfigSettings and Workflow.configfile, in that order)."""
    import copy

    from snakemake.utils import update_config

    overwrite: dict = {}
    for overlay in overlays:
        update_config(overwrite, copy.deepcopy(overlay))
    config = copy.deepcopy(overwrite)
    update_config(config, copy.deepcopy(base))
    update_config(config, overwrite)
    return config


@pytest.mark.parametrize(
    "base, overlay",
    [
        ({"a": {"b": 1, "c": [1, 2]}, "d": 1}, {"a": {"c": [3]}, "e": 2}),
        ({"a": {"b": 1}}, {"a": None}),  # null replaces a mapping
        ({"a": 5}, {"a": {"b": 1}}),  # a mapping replaces a non-mapping
        ({"a": 5, "n": None}, {"a": {}, "n": {}}),  # an empty mapping leaves what was there
        ({"a": {"b": {"c": 1, "d": 2}}}, {"a": {"b": {"d": 3}}}),
    ],
)
def test_merge_is_snakemakes(base, overlay):
    import copy

    from eyrie.common.config import merge

    assert merge(copy.deepcopy(base), overlay) == snakemake_merge(base, overlay)


def test_the_readmes_override_file_checks_as_snakemake_sees_it(tmp_path):
    from eyrie.common.config import merge, read

    overlay = tmp_path / "my-run.yaml"
    overlay.write_text(readme_overlay())
    run = subprocess.run(
        [sys.executable, "-m", "eyrie.cli.main", "config", str(overlay)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    shown = yaml.safe_load(run.stdout)
    expected = check(snakemake_merge(read(ROOT / "config.yaml"), read(overlay)))
    assert shown == expected
    assert shown == check(merge(read(ROOT / "config.yaml"), read(overlay)))
    assert shown["regenerate"]["enabled"] is True  # config.yaml's, not the schema's default
    assert shown["dataset"]["max_samples"] == {"train": None, "heldout": 500}
    assert run.stdout.startswith(f"# {overlay} merged over config.yaml")


def test_an_override_file_of_one_key_checks_from_the_workflow_folder(tmp_path):
    overlay = tmp_path / "small.yaml"
    overlay.write_text("extract:\n  shards: 4\n")
    cfg = load(overlay, base=ROOT / "config.yaml")
    assert cfg["extract"]["shards"] == 4 and cfg["target"]["path"] == "models/toy-llama-deep"
    with pytest.raises(ConfigError) as err:  # nothing to merge over: say so, and the fix
        load(overlay, base=tmp_path / "config.yaml")
    assert "'target' is a required property" in str(err.value)
    assert f"There is no {tmp_path / 'config.yaml'} here to merge {overlay} over" in str(err.value)
    with pytest.raises(ConfigError) as err:  # a subcommand's --config: a whole config
        load(overlay)
    assert f"`eyrie config {overlay} > whole.yaml`" in str(err.value)


# ---------------------------------------------------------------------------------------------
# values a pattern allows, in words


@pytest.mark.parametrize(
    "key, value, words",
    [
        (("extract", "precision"), "bitround-9",
         "extract.precision must be 'lossless' or 'bitround-N' with N from 0 to 6, got "
         "'bitround-9'"),
        (("capture", "cuda_graphs"), "yes", "capture.cuda_graphs must be true, false or 'auto'"),
        (("extract", "shard_tokens"), "big",
         "extract.shard_tokens must be an integer of at least 16, or 'auto', got 'big'"),
        (("extract", "writer_threads"), "many", "an integer of at least 1, or 'auto'"),
        (("extract", "writer_process"), "on", "extract.writer_process must be true, false or"),
        (("extract", "pin_forward"), 3, "extract.pin_forward must be true, false or 'auto', got 3"),
        (("results",), 7, "results must be a string, got 7"),
    ],
)  # fmt: skip
def test_a_value_out_of_a_pattern_says_the_allowed_values_in_words(key, value, words):
    cfg = default()
    node = cfg
    for k in key[:-1]:
        node = node.setdefault(k, {})
    node[key[-1]] = value
    message = str(pytest.raises(ConfigError, check, cfg).value)
    assert words in message
    assert "does not match" not in message and "^" not in message


def test_every_pattern_in_the_schema_has_its_allowed_values_in_words():
    from eyrie.common.config import schema

    def walk(node, key=""):
        if isinstance(node, dict):
            if "pattern" in node:
                yield key, node
            for name, sub in node.items():
                yield from walk(sub, f"{key}.{name}")
        elif isinstance(node, list):
            for sub in node:
                yield from walk(sub, key)

    patterns = list(walk(schema()))
    assert patterns
    for key, node in patterns:
        assert node.get("allowed"), f"{key} has a pattern but no `allowed` in words"


def test_the_reference_has_no_empty_allowed_cell():
    rows = [line.split(" | ") for line in reference().splitlines()[2:]]
    empty = [row[0] for row in rows if not row[3].strip()]
    assert not empty, f"keys without allowed values: {empty}"


def test_evaluate_settings_are_the_checked_configs_typed_once():
    from dataclasses import asdict

    from eyrie.evaluate.settings import evaluate_settings

    minimal = {"target": {"path": "m"}, "dataset": {"train": "a", "heldout": "b"}}
    filled = check(minimal)["evaluate"]
    assert asdict(evaluate_settings(None)) == filled  # the schema's defaults, every key typed
    assert asdict(evaluate_settings(filled)) == filled
    partial = evaluate_settings({"sglang": {"prompts": 3}, "topk": 2})
    assert partial.topk == 2 and partial.sglang.prompts == partial.served_prompts == 3
    assert partial.sglang.launch_timeout_s == filled["sglang"]["launch_timeout_s"]
    with pytest.raises(ConfigError, match=r"evaluate.sglang: unknown key\(s\) \['promts'\]"):
        evaluate_settings({"sglang": {"promts": 3}})


def test_every_stages_settings_hold_its_sections_keys_with_the_schemas_defaults():
    from dataclasses import asdict

    from eyrie.extract.settings import capture_settings, extract_settings
    from eyrie.regenerate.settings import regenerate_settings
    from eyrie.validate.settings import validate_settings

    filled = check({"target": {"path": "m"}, "dataset": {"train": "a", "heldout": "b"}})
    skipped = {"regenerate": {"enabled"}}  # the workflow's switch, no setting of a run
    builds = {"capture": capture_settings, "extract": extract_settings,
              "validate": validate_settings, "regenerate": regenerate_settings}  # fmt: skip
    for name, build in builds.items():
        want = {k: v for k, v in filled[name].items() if k not in skipped.get(name, ())}
        assert asdict(build(None)) == want, name
        assert asdict(build(filled[name])) == want, name
    with pytest.raises(ConfigError, match=r"extract: unknown key\(s\) \['chunk'\]"):
        extract_settings({"chunk": 3})
