"""Snakemake adapter for rule fetch_target: eyrie.fetch.stage.fetch_target."""

from pathlib import Path

from eyrie.common.adapter import rule_log
from eyrie.fetch.stage import fetch_target

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm):
    out = fetch_target(sm.params.source, Path(sm.output.config).parent, offline=True)
    print(f"wrote {out}")
