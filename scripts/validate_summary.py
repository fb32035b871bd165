"""Snakemake adapter for rule validate_summary: the table, and failure past max_errors."""

import contextlib

from eyrie.validate.shard import summarize

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with open(sm.log[0], "w") as log, contextlib.redirect_stdout(log):
    ok, message = summarize(sm.input.reports, sm.output.csv, sm.output.md, sm.params.max_errors)
    print(message)
if not ok:
    raise SystemExit(f"error: {message}")
