"""Snakemake adapter for rule prepare_dataset: eyrie.data.dataset.prepare on the rule's files."""

from eyrie.common.adapter import rule_log
from eyrie.data.dataset import prepare

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm, threads=False):
    prepare(
        sm.input.source,
        sm.output.jsonl,
        sm.output.problems,
        fmt=sm.params.format,
        on_bad=sm.params.on_bad_input,
        max_samples=sm.params.max_samples,
        split=sm.wildcards.split,
    )
