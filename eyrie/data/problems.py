"""A split's problems table (SPLIT.problems.csv, written by rule prepare_dataset), read back for
the run's end: how many lines of the split were skipped, of which kinds, and where to read each
one with its fix. The summary and the console at the end of a run say it, so bad lines never
stay in a job log nobody opens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from eyrie.data.dataset import NOTICE_KINDS

SUFFIX = ".problems.csv"


@dataclass(frozen=True)
class Skipped:
    """One split's skipped lines."""

    split: str
    table: str  # the problems table, as the run names it
    bad: int  # lines skipped as bad input
    blank: int  # blank lines (notices: harmless, but counted)
    by_kind: dict[str, int]
    kept: int | None  # conversations in the split's JSONL beside the table (None: not there)

    def line(self) -> str:
        """"train: 3 bad lines skipped (malformed_json 2, ...), 1197 conversations kept; each
        with its fix in results/data/train.problems.csv"."""
        text = f"{self.split}: {self.bad} bad line{'s' * (self.bad != 1)} skipped"
        if self.by_kind:
            text += " (" + ", ".join(f"{k} {n}" for k, n in self.by_kind.items()) + ")"
        if self.blank:
            text += f", {self.blank} blank line{'s' * (self.blank != 1)}"
        if self.kept is not None:
            text += f", {self.kept} conversations kept"
        if self.bad:
            return f"{text}; each with its fix in {self.table}"
        return f"{text} ({self.table})"


def read_skipped(table: str | Path) -> Skipped | None:
    """The skipped lines of the split whose problems table is `table` (None when it does not
    exist: the split was not prepared in this results folder)."""
    path = Path(table)
    if not path.is_file():
        return None
    try:
        kinds = pd.read_csv(path, usecols=["kind"])["kind"].astype(str)
    except (pd.errors.EmptyDataError, ValueError):
        kinds = pd.Series([], dtype=str)
    bad = kinds[~kinds.isin(NOTICE_KINDS)]
    data = path.with_name(path.name.removesuffix(SUFFIX) + ".jsonl")
    kept = None
    if data.is_file():
        with open(data, "rb") as fh:
            kept = sum(1 for line in fh if line.strip())
    return Skipped(
        split=path.name.removesuffix(SUFFIX),
        table=str(table),
        bad=len(bad),
        blank=len(kinds) - len(bad),
        by_kind={k: int(n) for k, n in sorted(bad.value_counts().items())},
        kept=kept,
    )
