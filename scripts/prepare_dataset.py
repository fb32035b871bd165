"""Snakemake adapter for rule prepare_dataset: eyrie.data.dataset.prepare on the rule's files.

A split with no usable conversation fails the job, and Snakemake then removes its outputs: its
problems table goes beside the job's log instead, which is kept.
"""

from pathlib import Path

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
        target=sm.params.target,
        max_tokens=sm.params.max_tokens,
        kept_problems_csv=Path(sm.log[0]).with_suffix(".problems.csv"),
        regenerate=sm.params.regenerate,
        leading_assistant=sm.params.leading_assistant,
    )
