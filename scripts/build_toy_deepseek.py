"""Snakemake adapter for rule build_toy_deepseek: eyrie.target.toy.deepseek.build."""

import contextlib
from pathlib import Path

from eyrie.target.toy.deepseek import build

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with open(sm.log[0], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    out = build(
        Path(sm.output.config).parent,
        Path(sm.input.tokenizer).parent,
        seed=sm.params.seed,
        tiny=sm.params.tiny,
    )
    print(f"built {out}")
