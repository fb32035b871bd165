"""Snakemake adapter for rule verify_env: eyrie.verify.run_stage on the rule's target.

On a failing verdict nothing is written and the job exits non-zero with the plain sentence.
The target folder's files are checked first (weights, tokenizer, chat template, the configured
architecture), so a folder extraction could not load fails here, before any GPU time.
"""

from eyrie.common.adapter import rule_log
from eyrie.verify import VerifyError, run_stage, write_report
from eyrie.verify.report import render
from eyrie.verify.stage import check_target_files

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm, threads=False):
    check_target_files(sm.input.target, sm.params.architecture)
    report = run_stage(
        sm.input.target,
        backend=sm.params.backend,
        aux_ids=sm.params.aux_layer_ids,
        sglang=sm.params.sglang,
        strict=bool(sm.params.strict),
        architecture=sm.params.architecture,
    )
    print(render(report))
    if report["failures"]:
        raise VerifyError(" ".join(report["failures"]))
    write_report(report, sm.output.json, sm.output.md)
