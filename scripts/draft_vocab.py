"""Snakemake adapter for rule draft_vocab: count, pick the top tokens, write the maps."""

import json
from pathlib import Path

from eyrie.common.adapter import rule_log
from eyrie.common.hf_config import text_config
from eyrie.train import vocab as draft_vocab

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm, threads=False):
    target = json.loads(Path(sm.input.target).read_text())
    vocab_size = int(text_config(target)["vocab_size"])
    size = min(int(sm.params.size), vocab_size)
    counts = draft_vocab.count_tokens(list(sm.input.stores), vocab_size)
    vocab = draft_vocab.build(counts, size)
    meta = {"stores": list(sm.input.stores), "target_config": sm.input.target}
    summary = draft_vocab.save(vocab, sm.output.vocab, meta)
    print(json.dumps(summary, indent=1))
