"""Snakemake adapter for rule evaluate_baselines: bigram and probe on the drafter's rows."""

from eyrie.common.adapter import rule_log
from eyrie.common.atomic import write_json
from eyrie.evaluate.baselines import measure

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm):
    rec = measure(
        list(sm.input.train),
        list(sm.input.heldout),
        sm.params.target,
        sm.params.max_len,
        probe_epochs=sm.params.probe_epochs,
        probe_width=sm.params.probe_width,
        with_final=False,
        progress=True,  # a line in the job's log every few seconds
    )
    write_json(sm.output.json, rec)
    print(rec)
