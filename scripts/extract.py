"""Snakemake adapter for rule extract: eyrie.extract.shard.extract_shard on the rule's files."""

from eyrie.common.adapter import rule_log
from eyrie.extract.shard import extract_shard

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm):
    extract_shard(
        data_path=sm.input.data,
        target_path=sm.params.target,
        architecture=sm.params.architecture,
        split=sm.wildcards.split,
        shard=int(sm.wildcards.shard),
        out_store=sm.output.store,
        errors_csv=sm.output.errors,
        capture=dict(sm.params.capture),
        extract=dict(sm.params.extract),
        max_tokens=sm.params.max_tokens,
        weights_cache=sm.params.weights_cache,
    )
