"""The results tree: Layout (the subcommands' defaults) and the rules spell the same paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from eyrie.common.layout import Layout, shard_name

ROOT = Path(__file__).resolve().parents[1]
RULES = "\n".join(p.read_text() for p in sorted((ROOT / "rules").glob("*.smk")))
# Layout rooted at "{R}" with Snakemake's doubled wildcard braces gives the rules' f-strings.
L = Layout(Path("{R}"))
SPLIT, SHARD = "{{split}}", "{{shard}}"


@pytest.mark.parametrize(
    "path",
    [
        L.dataset(SPLIT),
        L.problems(SPLIT),
        L.regenerated(SPLIT),
        L.store(SPLIT, SHARD),
        L.errors(SPLIT, SHARD),
        L.target_identity(),
        L.sha256_cache(),
        L.verify_report(),
        L.patch_dir(),
        L.vocab(),
        L.drafter() / "model.safetensors",
        L.train_dir() / "metrics.csv",
        L.validate_dir() / "summary.csv",
        L.evaluate_dir() / "acceptance.json",
        L.report_dir() / "summary.md",
        L.export("{{engine}}"),
        L.targets(),
    ],
    ids=str,
)
def test_every_layout_path_is_the_one_a_rule_names(path):
    assert f'f"{path}' in RULES, f"no rule names {path}; update rules/ or eyrie/common/layout.py"


def test_shard_names():
    assert shard_name(7) == shard_name("007") == shard_name("shard-007") == "shard-007"
    assert shard_name("{shard}") == "shard-{shard}"
    assert Layout.of({"results": "r"}).store("train", 1) == Path("r/store/train/shard-001.zarr")


def test_conversations_follow_regenerate_enabled():
    lay = Layout(Path("r"))
    assert lay.conversations({"regenerate": {"enabled": False}}, "train") == Path(
        "r/data/train.jsonl"
    )
    assert lay.conversations({"regenerate": {"enabled": True}}, "train") == Path(
        "r/regen/train.jsonl"
    )
