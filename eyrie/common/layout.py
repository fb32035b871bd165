"""Where each stage's outputs live under the results folder: one place, read by every stage.

The Snakemake rules (rules/common.smk) and the `eyrie` subcommands' defaults both take their
paths from here, so a rule's output and the path a subcommand reads by default cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class Layout:
    """The results tree of one run (`results:` in the config)."""

    root: Path

    @classmethod
    def of(cls, config: dict) -> Layout:
        return cls(Path(config.get("results", "results")))

    # data and targets
    def dataset(self, split: str) -> Path:
        return self.root / "data" / f"{split}.jsonl"

    def regenerated(self, split: str) -> Path:
        return self.root / "regen" / f"{split}.jsonl"

    def regenerated_summary(self, split: str) -> Path:
        return self.root / "regen" / f"{split}.summary.json"

    def conversations(self, config: dict, split: str) -> Path:
        """What a split's stores are made of: the regenerated split when regenerate.enabled."""
        if (config.get("regenerate") or {}).get("enabled"):
            return self.regenerated(split)
        return self.dataset(split)

    def targets(self) -> Path:
        return self.root / "targets"

    # verify and patch
    def verify_report(self) -> Path:
        return self.root / "verify" / "report.json"

    def patch_dir(self) -> Path:
        return self.root / "patch"

    # extract and validate
    def store_dir(self, split: str) -> Path:
        return self.root / "store" / split

    def store(self, split: str, shard: int | str) -> Path:
        return self.store_dir(split) / f"{shard_name(shard)}.zarr"

    def errors(self, split: str, shard: int | str) -> Path:
        return self.store_dir(split) / f"{shard_name(shard)}.errors.csv"

    def stores(self, split: str) -> list[Path]:
        """The split's stores that exist, in shard order."""
        return sorted(self.store_dir(split).glob("shard-*.zarr"))

    def weights_cache(self) -> Path:
        return self.root / "store" / ".weights-sha256.json"

    def validate_dir(self) -> Path:
        return self.root / "validate"

    # train and export
    def vocab(self) -> Path:
        return self.root / "draft_vocab" / "vocab.safetensors"

    def train_dir(self) -> Path:
        return self.root / "train"

    def drafter(self) -> Path:
        return self.train_dir() / "drafter"

    def export(self, engine: str) -> Path:
        return self.root / "export" / engine

    # evaluate and report
    def evaluate_dir(self) -> Path:
        return self.root / "evaluate"

    def report_dir(self) -> Path:
        return self.root / "report"


def shard_name(shard: int | str) -> str:
    """shard-NNN, from 7 or "007" or "shard-007"."""
    text = str(shard)
    if text.startswith("shard-"):
        return text
    return f"shard-{int(text):03d}"
