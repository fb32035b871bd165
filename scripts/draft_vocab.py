"""Snakemake adapter for rule draft_vocab: eyrie.train.stage.draft_vocab on the train stores."""

import json

from eyrie.common.adapter import rule_log
from eyrie.train.stage import draft_vocab

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm, threads=False):
    summary = draft_vocab(
        stores=list(sm.input.stores),
        target_config=sm.input.target,
        size=sm.params.size,
        out=sm.output.vocab,
    )
    print(json.dumps(summary, indent=1))
