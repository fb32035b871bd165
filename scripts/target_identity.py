"""Snakemake adapter for rule target_identity: eyrie.target.identity for a toy built by the run."""

from pathlib import Path

from eyrie.common.adapter import rule_log
from eyrie.target.identity import update_identity

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm, threads=False):
    update_identity(Path(sm.input.config).parent, sm.output.identity, sm.params.cache)
