"""Snakemake adapter for rule check_overlap: eyrie.data.overlap on the two splits of a folder."""

from eyrie.common.adapter import rule_log
from eyrie.data.overlap import check_overlap

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm, threads=False):
    report = check_overlap(
        sm.input.train,
        sm.input.heldout,
        sm.output.report,
        sources=dict(sm.params.sources),
        key=sm.params.key,
        allow=sm.params.allow,
        regenerated=sm.wildcards.splits == "regen",
    )
    held = report["heldout"]["samples"]
    print(f"{report['shared']} of {held} held-out samples are train samples")
