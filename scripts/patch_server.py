"""Snakemake adapter for rule patch_server: eyrie.sglang.patch.bundle on verify_env's report."""

from eyrie.common.adapter import rule_log
from eyrie.sglang.patch.bundle import bundle_from_config

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm, threads=False):
    manifest = bundle_from_config(sm.input.report, sm.output.bundle, dict(sm.params.capture))
    print(f"mechanism {manifest['mechanism']}: {manifest['mechanism_why']}")
