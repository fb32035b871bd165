"""Where each stage's outputs live under the results folder: one table, read by every stage.

The `eyrie` subcommands take their default paths from here; the Snakemake rules spell the same
paths in their f-strings (tests/test_layout.py holds the two together), so a rule's output and
the path a subcommand reads by default cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "heldout")


def _under(relative: str):
    """A Layout method returning {results}/relative."""

    def path(self) -> Path:
        return self.root / relative

    path.__doc__ = f"{{results}}/{relative}"
    return path


@dataclass(frozen=True)
class Layout:
    """The results tree of one run (`results:` in the config)."""

    root: Path

    @classmethod
    def of(cls, config: dict) -> Layout:
        return cls(Path(config.get("results", "results")))

    targets = _under("targets")
    verify_report = _under("verify/report.json")
    patch_dir = _under("patch")
    target_identity = _under("target/identity.json")
    sha256_cache = _under("target/.sha256-cache.json")
    validate_dir = _under("validate")
    vocab = _under("draft_vocab/vocab.safetensors")
    train_dir = _under("train")
    drafter = _under("train/drafter")
    evaluate_dir = _under("evaluate")
    report_dir = _under("report")

    def dataset(self, split: str) -> Path:
        return self.root / "data" / f"{split}.jsonl"

    def problems(self, split: str) -> Path:
        """The split's problems table: every line prepare_dataset skipped, with its fix."""
        return self.root / "data" / f"{split}.problems.csv"

    def regenerated(self, split: str) -> Path:
        return self.root / "regen" / f"{split}.jsonl"

    def conversations(self, config: dict, split: str) -> Path:
        """What a split's stores are made of: the regenerated split when regenerate.enabled."""
        if (config.get("regenerate") or {}).get("enabled"):
            return self.regenerated(split)
        return self.dataset(split)

    def store_dir(self, split: str) -> Path:
        return self.root / "store" / split

    def store(self, split: str, shard: int | str) -> Path:
        return self.store_dir(split) / f"{shard_name(shard)}.zarr"

    def errors(self, split: str, shard: int | str) -> Path:
        return self.store_dir(split) / f"{shard_name(shard)}.errors.csv"

    def export(self, engine: str) -> Path:
        return self.root / "export" / engine


def configured_stores(config: dict, split: str) -> list[Path]:
    """The split's configured stores (extract.shards of them), whether they exist yet or not."""
    layout = Layout.of(config)
    return [layout.store(split, i) for i in range(config["extract"]["shards"])]


def shard_name(shard: int | str) -> str:
    """shard-NNN, from 7 or "007" or "shard-007" (a Snakemake wildcard such as "{shard}" is
    kept as it is: shard-{shard})."""
    text = str(shard)
    if text.startswith("shard-"):
        return text
    return f"shard-{int(text):03d}" if text.isdigit() else f"shard-{text}"
