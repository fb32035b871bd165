"""Snakemake adapter for rule regenerate: eyrie.regenerate.stage.regenerate_split on one split."""

from eyrie.common.adapter import rule_log
from eyrie.regenerate.stage import regenerate_split

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm):
    summary = regenerate_split(
        data_path=sm.input.data,
        target_path=sm.params.target,
        out_jsonl=sm.output.jsonl,
        summary_json=sm.output.summary,
        settings=dict(sm.params.settings),
        architecture=sm.params.architecture,
        split=sm.wildcards.split,
        progress=False,
    )
    print(summary["counts"])
