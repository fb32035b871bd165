"""Snakemake adapter for rule build_toy_deepseek: eyrie.target.toy.deepseek.build."""

from pathlib import Path

from eyrie.common.adapter import rule_log
from eyrie.target.toy.deepseek import build

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm, threads=False):
    out = build(
        Path(sm.output.config).parent,
        Path(sm.input.tokenizer).parent,
        seed=sm.params.seed,
        tiny=sm.params.tiny,
    )
    print(f"built {out}")
