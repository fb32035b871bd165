"""All shards' reports together: samples stored twice across shards, the table, the verdict.

The summary fails the workflow when the errors of all shards exceed validate.max_errors, and
then says, per failing shard, what fixes it; and when a split stored no sample at all, whatever
validate.max_errors allows, since training and evaluation need both splits.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from eyrie.common.atomic import write_text
from eyrie.validate.problems import KINDS


def cross_shard(reports: list[dict], across_splits: bool = True) -> None:
    """Add a cross_shard problem to a report for each sample another shard also stores; of the
    same split only when not `across_splits` (dataset.allow_overlap: the splits may share)."""
    import zarr

    owners: dict[str, dict[str, str]] = {}
    for rep in reports:
        owner = owners.setdefault("all" if across_splits else rep["split"], {})
        try:
            group = zarr.open_group(zarr.storage.LocalStore(rep["store"], read_only=True), mode="r")
            n = int(json.loads((Path(rep["store"]) / "commit.json").read_text())["num_samples"])
            ids = [str(s) for s in group["sample_id"][:n]] if n else []
        except Exception:
            continue  # already reported as unreadable by the shard's own check
        where = f"{rep['split']}/{rep['shard']}"
        for sid in set(ids):
            if sid in owner:
                counts = rep.setdefault("error_counts", {})
                counts["cross_shard"] = counts.get("cross_shard", 0) + 1
                rep["errors"] = rep.get("errors", 0) + 1
                rep.setdefault("problems", []).append(
                    {"kind": "cross_shard", "sample_id": sid, "detail": f"also in {owner[sid]}"}
                )
            else:
                owner[sid] = where


def summary_table(reports: list[dict]) -> pd.DataFrame:
    """One row per (split, shard) and a total row."""
    rows = []
    for r in sorted(reports, key=lambda r: (r["split"], r["shard"])):
        rows.append(
            {
                "split": r["split"],
                "shard": r["shard"],
                "samples": r.get("samples", 0),
                "tokens": r.get("tokens", 0),
                "truncated": r.get("truncated", 0),
                "bytes_stored": r.get("bytes_stored", 0),
                "bytes_per_token": r.get("bytes_per_token"),
                "compression_ratio": r.get("compression_ratio"),
                "greedy_match": r.get("greedy_match"),
                "min_cosine": r.get("min_cosine"),
                "errors": r.get("errors", 0),
                **{f"err:{k}": v for k, v in r.get("error_counts", {}).items()},
            }
        )
    df = pd.DataFrame(rows)
    err_cols = sorted(c for c in df.columns if c.startswith("err:"))
    df[err_cols] = df[err_cols].fillna(0).astype(int)
    base = [c for c in df.columns if not c.startswith("err:")]
    df = df[base + err_cols]
    total = {"split": "all", "shard": "all"}
    for c in ("samples", "tokens", "truncated", "bytes_stored", "errors", *err_cols):
        total[c] = int(df[c].sum())
    total["bytes_per_token"] = total["bytes_stored"] / total["tokens"] if total["tokens"] else None
    ratios = df["compression_ratio"].dropna()
    total["compression_ratio"] = float(ratios.mean()) if len(ratios) else None
    greedy = df["greedy_match"].dropna()
    total["greedy_match"] = float(greedy.min()) if len(greedy) else None
    cos = df["min_cosine"].dropna()
    total["min_cosine"] = float(cos.min()) if len(cos) else None
    return pd.concat([df, pd.DataFrame([total])], ignore_index=True)


def markdown(df: pd.DataFrame) -> str:
    """A Markdown table without optional dependencies (pandas' to_markdown needs tabulate)."""

    digits = {"min_cosine": 6, "greedy_match": 4, "compression_ratio": 3, "bytes_per_token": 1}

    def cell(col, v):
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return "-"
        if isinstance(v, float):
            return f"{v:.{digits.get(col, 4)}f}"
        return str(v)

    cols = list(df.columns)
    head = "| " + " | ".join(cols) + " |"
    rule = "|" + "|".join("---" for _ in cols) + "|"
    body = [
        "| " + " | ".join(cell(c, v) for c, v in zip(cols, row, strict=True)) + " |"
        for row in df.itertuples(index=False)
    ]
    return "\n".join([head, rule, *body]) + "\n"


def empty_splits(reports: list[dict]) -> list[str]:
    """A sentence per split whose shards stored no sample."""
    out = []
    for split in sorted({r["split"] for r in reports}):
        mine = [r for r in reports if r["split"] == split]
        if sum(int(r.get("samples", 0)) for r in mine):
            continue
        errors = sum(int(r.get("errors", 0)) for r in mine)
        tables = ", ".join(str(r["errors_csv"]) for r in mine if r.get("errors_csv"))
        why = f"; its {errors} errors are listed in {tables}" if errors and tables else ""
        out.append(
            f"split {split} stored no sample in its {len(mine)} shard(s){why}. Training and "
            "evaluation need samples in both splits: fix the inputs those tables name (the "
            "dataset's problems tables under data/ list the lines prepare_dataset skipped)"
        )
    return out


def summarize(
    report_paths: list,
    csv_path,
    md_path,
    max_errors: int,
    rerun=None,
    allow_overlap: bool = False,
) -> tuple[bool, str]:
    """Write the summary table; (ok, message) where ok is False past validate.max_errors or
    when a split is empty. `rerun` (eyrie.common.rerun.Rerun): how the user runs the workflow,
    for the commands the advice prints; `allow_overlap`: ids shared by the two splits are not
    errors (dataset.allow_overlap)."""
    reports = [json.loads(Path(p).read_text()) for p in report_paths]
    cross_shard(reports, across_splits=not allow_overlap)
    df = summary_table(reports)
    total = int(df.iloc[-1]["errors"])
    kinds = {c[4:]: int(df.iloc[-1][c]) for c in df.columns if c.startswith("err:")}
    md = "# Hidden-state validation\n\n" + markdown(df)
    md += "\n`truncated`: samples stored cut at dataset.max_tokens (counted, not errors).\n"
    if kinds:
        md += "\nError kinds:\n\n" + "".join(
            f"- `{k}` ({n}): {KINDS.get(k, 'listed by the extraction: ' + k.split(':', 1)[-1])}\n"
            for k, n in kinds.items()
        )
    for path, text in ((csv_path, df.to_csv(index=False)), (md_path, md)):
        write_text(path, text)
    empty = empty_splits(reports)
    ok = total <= max_errors and not empty
    msg = (
        f"validation: {total} errors over {len(reports)} shards "
        f"({', '.join(f'{k}={n}' for k, n in kinds.items()) or 'none'}); "
        f"validate.max_errors is {max_errors}"
    )
    if empty:
        msg = "validation: " + "; ".join(empty) + f"\n{msg}"
    if total > max_errors:
        from eyrie.validate.advice import shard_advice

        advice = [shard_advice(r, rerun) for r in reports if r.get("errors")]
        msg += (
            ". The per-shard reports list each problem with its sample id. What fixes it:\n"
            + "".join(f"- {a}\n" for a in advice if a)
        )
    return ok, msg + "\n\n" + md
