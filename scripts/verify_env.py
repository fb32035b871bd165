"""Snakemake adapter for rule verify_env: eyrie.verify.run_stage on the rule's target.

On a failing verdict nothing is written and the job exits non-zero with the plain sentence.
"""

import contextlib

from eyrie.verify import VerifyError, run_stage, write_report
from eyrie.verify.report import render

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

error = None
with open(sm.log[0], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    try:
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
            error = " ".join(report["failures"])
        else:
            write_report(report, sm.output.json, sm.output.md)
    except VerifyError as exc:
        error = str(exc)
    if error is not None:
        print(f"error: {error}")
if error is not None:
    raise SystemExit(f"error: {error}")
