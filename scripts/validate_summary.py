"""Snakemake adapter for rule validate_summary: the table, and failure past max_errors."""

from eyrie.common.adapter import rule_log
from eyrie.common.rerun import Rerun
from eyrie.validate.summary import summarize

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm, threads=False):
    ok, message = summarize(
        sm.input.reports,
        sm.output.csv,
        sm.output.md,
        sm.params.max_errors,
        rerun=Rerun.from_environ(),  # the user's config files (rules/common.smk)
        allow_overlap=sm.params.allow_overlap,
    )
    print(message)
if not ok:
    raise SystemExit(f"error: {message}")
