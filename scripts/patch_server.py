"""Snakemake adapter for rule patch_server: eyrie.sglang.patch.bundle on verify_env's report."""

import contextlib

from eyrie.sglang.patch.bundle import PatchError, bundle_from_config

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

error = None
with open(sm.log[0], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    try:
        manifest = bundle_from_config(sm.input.report, sm.output.bundle, dict(sm.params.capture))
        print(f"mechanism {manifest['mechanism']}: {manifest['mechanism_why']}")
    except PatchError as exc:
        error = exc
        print(f"error: {exc}")
if error is not None:
    raise SystemExit(f"error: {error}")
