"""Snakemake adapter for rule export_drafter: eyrie.export.stage.export_checked writes one
engine's folder, then checks it again against expectations taken from the store and the target,
not from the drafter's own record."""

import json
from pathlib import Path

from eyrie.common.adapter import rule_log
from eyrie.export.stage import export_checked

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm, threads=False):
    report = export_checked(
        drafter_dir=Path(sm.input.weights).parent,
        out_dir=sm.output.folder,
        engine=sm.wildcards.engine,
        settings=dict(sm.params.export),
        target_dir=Path(sm.input.target).parent,
        vocab_path=sm.input.vocab,
        store=sm.input.store,
        check_json=sm.output.check,
    )
    print(json.dumps(report, indent=1))
