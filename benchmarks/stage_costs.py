"""Each stage's cost in a finished run, from the run's own records: wall time, tokens and
tokens/s, peak host memory, and the disk its outputs take; plus Snakemake's bookkeeping.

    python benchmarks/stage_costs.py RESULTS [--snakemake-dir .snakemake] [--json OUT]
    python benchmarks/stage_costs.py --compare costs-A.json costs-B.json ...

Wall time and peak memory (max RSS) come from each job's `benchmark:` file
(RESULTS/benchmarks/**.tsv, summed over a rule's jobs; the peak is the largest job's). Tokens:
the stored tokens (validate/summary.csv) for extract and validate_shard, the tokens trained on
(train/metrics.csv, every epoch) for train_drafter. Disk: the bytes under each stage's output
folder. GPU memory and open files are not in these records; a run that needs them samples them
while it runs (scripts/gpu_rehearsal.sh adds them to the JSON). --compare sets runs of several
sizes side by side: each stage's seconds per million stored tokens, and its largest over its
smallest across sizes (flat within 1.2 is the rehearsal's bar).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from eyrie.common.provenance import dir_bytes

# rule -> the output folder whose bytes it is charged with
OUTPUTS = {"regenerate": "regen", "extract": "store", "validate_shard": "validate",
           "draft_vocab": "draft_vocab", "train_drafter": "train",
           "export_drafter": "export"}  # fmt: skip


def rule_of(rel: Path) -> str:
    """The rule a benchmark file belongs to (rules/*.smk name them benchmarks/RULE[/...].tsv,
    but benchmarks/validate/ and benchmarks/evaluate/ hold several rules')."""
    top, stem = rel.parts[0].removesuffix(".tsv"), rel.name.removesuffix(".tsv")
    if top == "validate":
        return "validate_summary" if stem == "summary" else "validate_shard"
    if top == "evaluate":
        return f"evaluate_{stem}"
    return top


def rule_records(results: Path) -> dict[str, dict]:
    """rule -> summed seconds, the largest max_rss (MB) and the job count, from benchmark files."""
    rules: dict[str, dict] = {}
    for tsv in sorted((results / "benchmarks").rglob("*.tsv")):
        rule = rule_of(tsv.relative_to(results / "benchmarks"))
        with open(tsv, newline="") as f:
            row = list(csv.DictReader(f, delimiter="\t"))[-1]  # the last repeat
        rec = rules.setdefault(rule, {"seconds": 0.0, "max_rss_mb": 0.0, "jobs": 0})
        rec["seconds"] += float(row["s"])
        rec["max_rss_mb"] = max(rec["max_rss_mb"], float(row["max_rss"] or 0))
        rec["jobs"] += 1
    return rules


def stage_tokens(results: Path) -> dict[str, int]:
    tokens = {}
    summary = results / "validate" / "summary.csv"
    if summary.is_file():
        with open(summary, newline="") as f:
            stored = sum(int(r["tokens"]) for r in csv.DictReader(f) if r["split"] != "all")
        tokens["extract"] = tokens["validate_shard"] = stored
    metrics = results / "train" / "metrics.csv"
    if metrics.is_file():
        with open(metrics, newline="") as f:
            tokens["train_drafter"] = sum(int(r["tokens"]) for r in csv.DictReader(f))
    return tokens


def stage_costs(results: Path, snakemake_dir: Path | None = None) -> dict:
    rules, tokens = rule_records(results), stage_tokens(results)
    rows = []
    for rule, rec in rules.items():
        n = tokens.get(rule)
        rows.append({"stage": rule, **rec, "tokens": n,
                     "tokens_per_s": n / rec["seconds"] if n and rec["seconds"] else None,
                     "disk_bytes": dir_bytes(results / OUTPUTS[rule])
                     if rule in OUTPUTS else None})  # fmt: skip
    book = dir_bytes(snakemake_dir) if snakemake_dir else None
    return {"results": str(results), "stages": rows, "snakemake_bookkeeping_bytes": book}


def table(costs: dict) -> str:
    def cell(v, fmt):
        return "-" if v is None else format(v, fmt)

    lines = ["| stage | jobs | wall s | tokens | tokens/s | max RSS MB | disk MB |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in costs["stages"]:
        disk = None if r["disk_bytes"] is None else r["disk_bytes"] / 1e6
        lines.append(f"| {r['stage']} | {r['jobs']} | {r['seconds']:.1f} | "
                     f"{cell(r['tokens'], ',')} | {cell(r['tokens_per_s'], ',.0f')} | "
                     f"{r['max_rss_mb']:.0f} | {cell(disk, ',.1f')} |")  # fmt: skip
    if costs["snakemake_bookkeeping_bytes"] is not None:
        lines.append(
            f"\nSnakemake's bookkeeping: {costs['snakemake_bookkeeping_bytes'] / 1e6:.1f} MB"
        )
    return "\n".join(lines)


def margins(
    points: list[tuple[int, float]], noise_s: float = 1.0
) -> tuple[float, float, float | None]:
    """Points (tokens, seconds), smallest first: the fixed seconds and the seconds per million
    tokens of the line through the smallest and the largest, and the last pair's seconds per
    million tokens over the first pair's (None under three points). A stage's cost per token
    falls with size while a fixed cost (a process, a model load) is amortized; only a growing
    margin means a cost that grows faster than the data. A growth is reported only where it
    adds more than ``noise_s`` seconds over the last pair of sizes: a job's start alone varies
    by about that much, so a stage of a second or two would otherwise be flagged by jitter."""
    (n0, s0), (n1, s1) = points[0], points[-1]
    marginal = (s1 - s0) / (n1 - n0) * 1e6
    growth = None
    if len(points) > 2:
        first = (points[1][1] - s0) / (points[1][0] - n0)
        last = (s1 - points[-2][1]) / (n1 - points[-2][0])
        if first > 0 and (last - first) * (n1 - points[-2][0]) > noise_s:
            growth = last / first
    return s0 - marginal * n0 / 1e6, marginal, growth


def verdict(ratio: float, growth: float | None, limit: float = 1.2) -> str:
    if ratio > limit:
        return "**grows**"
    if growth is not None and growth > limit:
        return f"**grows at the margin** ({growth:.2f}×)"
    return "flat" if ratio >= 1 / limit else "falls: fixed cost"


def compare(runs: list[dict]) -> str:
    """Stage × size: seconds per million stored tokens, the largest size's over the smallest's,
    the fixed and marginal cost through them, and a verdict (limit 1.2×)."""

    def stored(run):
        return next((r["tokens"] for r in run["stages"] if r["stage"] == "extract"), None) or 0

    runs = sorted(runs, key=stored)
    head = " | ".join(f"{stored(r):,} tokens" for r in runs)
    lines = [f"| stage (s per M tokens) | {head} | largest ÷ smallest | fixed s | "
             "marginal s per M | |",
             "|---|" + "---|" * (len(runs) + 4)]  # fmt: skip
    stages = sorted({r["stage"] for run in runs for r in run["stages"]})
    for stage in stages:
        points = []
        for run in runs:
            row = next((r for r in run["stages"] if r["stage"] == stage), None)
            points.append((stored(run), row["seconds"]) if row and stored(run) else None)
        per = [p and p[1] / p[0] * 1e6 for p in points]
        known = [p for p in points if p]
        cells = " | ".join("-" if v is None else f"{v:,.1f}" for v in per)
        if len(known) < 2 or known[0][0] == known[-1][0]:
            lines.append(f"| {stage} | {cells} | - | - | - | |")
            continue
        ratio = (known[-1][1] / known[-1][0]) / (known[0][1] / known[0][0])
        fixed, marginal, growth = margins(known)
        lines.append(f"| {stage} | {cells} | {ratio:.2f} | {fixed:,.1f} | {marginal:,.1f} | "
                     f"{verdict(ratio, growth)} |")  # fmt: skip
    for key, unit, scale in (("peak_gpu_mib", "MiB", 1), ("peak_open_files", "", 1),
                             ("results_bytes", "MB", 1e-6),
                             ("snakemake_bookkeeping_bytes", "MB", 1e-6)):  # fmt: skip
        vals = [r.get(key) for r in runs]
        cells = " | ".join("-" if v is None else f"{v * scale:,.2f} {unit}".strip() for v in vals)
        lines.append(f"| {key} | {cells} | | | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, nargs="?")
    ap.add_argument("--snakemake-dir", type=Path, help="the run's .snakemake folder")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    ap.add_argument("--compare", type=Path, nargs="+", help="costs JSONs of runs of several sizes")
    args = ap.parse_args(argv)
    if args.compare:
        print(compare([json.loads(p.read_text()) for p in args.compare]))
        return 0
    if args.results is None or not (args.results / "benchmarks").is_dir():
        print(f"error: {args.results}/benchmarks is not there; give a run's results folder",
              file=sys.stderr)  # fmt: skip
        return 2
    costs = stage_costs(args.results, args.snakemake_dir)
    print(table(costs))
    if args.json:
        args.json.write_text(json.dumps(costs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
