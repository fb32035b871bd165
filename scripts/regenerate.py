"""Snakemake adapter for rule regenerate: eyrie.regenerate.stage.regenerate_split on one split."""

from eyrie.common.adapter import rule_log
from eyrie.regenerate.stage import SplitJob, regenerate_split

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm):
    job = SplitJob(
        data=sm.input.data,
        target=sm.params.target,
        out=sm.output.jsonl,  # the summary beside it is sm.output.summary
        split=sm.wildcards.split,
        architecture=sm.params.architecture,
        sample_tokens=sm.params.sample_tokens,
    )
    # progress: a line in the job's log every few seconds (turns, tokens/s, ETA)
    summary = regenerate_split(job, dict(sm.params.settings), progress=True)
    print(summary["counts"])
