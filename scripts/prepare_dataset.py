"""Snakemake adapter for rule prepare_dataset: eyrie.data.dataset.prepare on the rule's files."""

import contextlib

from eyrie.data.dataset import DatasetError, prepare

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

error = None
with open(sm.log[0], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    try:
        prepare(
            sm.input.source,
            sm.output.jsonl,
            sm.output.problems,
            fmt=sm.params.format,
            on_bad=sm.params.on_bad_input,
            max_samples=sm.params.max_samples,
            split=sm.wildcards.split,
        )
    except DatasetError as exc:
        error = exc
        print(f"error: {exc}")
if error is not None:
    raise SystemExit(f"error: {error}")
