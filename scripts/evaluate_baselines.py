"""Snakemake adapter for rule evaluate_baselines: bigram and probe on the drafter's rows."""

import contextlib

import torch

from eyrie.common.atomic import write_json
from eyrie.evaluate.baselines import measure

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

torch.set_num_threads(sm.threads)
with open(sm.log[0], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    rec = measure(
        list(sm.input.train),
        list(sm.input.heldout),
        sm.params.target,
        sm.params.max_len,
        probe_epochs=sm.params.probe_epochs,
        probe_width=sm.params.probe_width,
        with_final=False,
    )
    write_json(sm.output.json, rec)
    print(rec)
