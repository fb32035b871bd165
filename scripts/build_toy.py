"""Snakemake adapter for rules build_toy_deepseek and build_toy_kimi: the `build` of the toy
module the rule names in params.builder (eyrie.target.toy.deepseek or eyrie.target.toy.kimi)."""

import importlib
from pathlib import Path

from eyrie.common.adapter import rule_log

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

build = importlib.import_module(f"eyrie.target.toy.{sm.params.builder}").build
with rule_log(sm, threads=False):
    out = build(
        Path(sm.output.config).parent,
        Path(sm.input.tokenizer).parent,
        seed=sm.params.seed,
        tiny=sm.params.tiny,
    )
    print(f"built {out}")
