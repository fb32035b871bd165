"""The errors table of a shard: every sample that could not be extracted, and why.

Columns sample_id, line, source, reason, detail. The table is keyed by the line of the split
file, so a resumed run never lists a sample twice; it is rewritten whole after each commit.
"""

from __future__ import annotations

import csv
from pathlib import Path

from eyrie.common.atomic import atomic_path

ERROR_COLUMNS = ("sample_id", "line", "source", "reason", "detail")


def read_errors(path: str | Path) -> dict[int, tuple[str, str, str]]:
    """line -> (sample_id, reason, detail) of an errors table; {} when there is none."""
    path = Path(path)
    if not path.is_file():
        return {}
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return {int(r["line"]): (r["sample_id"], r["reason"], r["detail"]) for r in rows}


def write_errors(
    path: str | Path, errors: dict[int, tuple[str, str, str]], sources: dict | None = None
) -> None:
    """Rewrite the whole table (in line order) under a temp name, then rename it into place.

    `sources` maps a split-file line to its "FILE:LINE" in the user's file (column source)."""
    sources = sources or {}
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(ERROR_COLUMNS)
        for line in sorted(errors):
            sid, reason, detail = errors[line]
            w.writerow((sid, line, sources.get(line, ""), reason, detail))


def count_reasons(errors: dict) -> dict[str, int]:
    """reason -> how many samples of the table have it."""
    counts: dict[str, int] = {}
    for _, reason, _ in errors.values():
        counts[reason] = counts.get(reason, 0) + 1
    return counts
