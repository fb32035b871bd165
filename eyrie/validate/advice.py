"""What fixes a shard that fails validation, with the commands to run.

Damage to a store (a chunk that does not decode, a store half deleted, values that do not
match the target) is fixed by deleting the store and extracting that shard again; samples the
extraction listed in its errors table are input problems, fixed in the dataset (or accepted by
raising validate.max_errors).

The commands are the user's own (eyrie.common.rerun.Rerun: their Snakefile and folder when not
the defaults, their --configfile files and --config values), so each runs as printed.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from eyrie.common.rerun import Rerun
from eyrie.store.shard import ALL_ARRAYS, COMMIT_RECORD

# Metadata every finished store has; one missing means the store was (partly) deleted.
STORE_FILES = ("zarr.json", COMMIT_RECORD, *(f"{a}/zarr.json" for a in ALL_ARRAYS))


def missing_parts(store: str | Path) -> list[str]:
    """The store's metadata files that are absent (all of them when the folder is gone)."""
    store = Path(store)
    return [f for f in STORE_FILES if not (store / f).is_file()]


def half_deleted(store: str | Path) -> str | None:
    """A sentence saying the store is half deleted, or None when its metadata is all there."""
    store = Path(store)
    gone = missing_parts(store)
    if not store.is_dir() or not gone:
        return None
    return (
        f"{store} is half deleted: {', '.join(gone)} missing. A job killed while its old store "
        "was being removed (e.g. during `snakemake --forcerun extract`) leaves this"
    )


def reextract_commands(report: dict, rerun: Rerun | None = None) -> str:
    """`rm -rf` of the shard's store and table, then the command that extracts it again."""
    rerun = rerun or Rerun()
    store = report["store"]
    errors = report.get("errors_csv") or str(
        Path(store).with_name(Path(store).name.removesuffix(".zarr") + ".errors.csv")
    )
    split, shard = report["split"], int(report["shard"])
    text = (
        f"`{shlex.join(['rm', '-rf', rerun.local(store), rerun.local(errors)])}`, then "
        f"`{rerun.targets(store)}` (or run the whole workflow again as before)"
    )
    if rerun.eyrie_config is not None:
        cfg = shlex.quote(rerun.eyrie_config)
        text += f", or `eyrie extract --config {cfg} --split {split} --shard {shard}`"
    return text


def shard_advice(report: dict, rerun: Rerun | None = None) -> str:
    """One paragraph for a shard with problems: what each group of problems needs."""
    kinds = report.get("error_counts", {})
    own = {k: n for k, n in kinds.items() if not k.startswith("extract:")}
    listed = sum(n for k, n in kinds.items() if k.startswith("extract:"))
    where = f"{report['split']}/{report['shard']}"
    parts = []
    if own:
        what = ", ".join(f"{k}={n}" for k, n in sorted(own.items()))
        fix = reextract_commands(report, rerun)
        parts.append(
            f"shard {where} ({what}): the store is damaged or does not match its input and "
            f"target; delete it and extract the shard again: {fix}"
        )
    if listed:
        parts.append(
            f"shard {where}: {listed} samples the extraction could not use are listed in its "
            "errors table (by line of the source file); fix those lines in the dataset, or raise "
            "validate.max_errors if losing them is acceptable"
        )
    return "; ".join(parts)


def over_limit(report: dict, max_errors: int, rerun: Rerun | None = None) -> str | None:
    """The message for one shard with more problems than validate.max_errors, else None."""
    total = int(report.get("errors", 0))
    if total <= max_errors:
        return None
    return (
        f"validation of shard {report['split']}/{report['shard']} ({report['store']}): "
        f"{total} errors, more than validate.max_errors ({max_errors}). "
        f"{shard_advice(report, rerun)}"
    )
