"""Snakemake adapter for rule evaluate_acceptance: offline acceptance on the held-out stores."""

import contextlib

import torch

from eyrie.cli.evaluate import known_errors, run_evaluate

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

torch.set_num_threads(sm.threads)
error = None
with open(sm.log[0], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    try:
        rec = run_evaluate(
            drafter_dir=sm.params.drafter,
            target_dir=sm.params.target,
            stores=list(sm.input.stores),
            steps=sm.params.steps,
            batch_size=sm.params.batch_size,
            max_len=sm.params.max_len,
            device=sm.params.device,
            out_json=sm.output.json,
            out_csv=sm.output.csv,
        )
        print(f"acc {rec['acc']}; tau {rec['tau']:.3f}, with bonus {rec['tau_with_bonus']:.3f}")
    except known_errors() as exc:
        error = exc
        print(f"error: {exc}")
if error is not None:
    raise SystemExit(f"error: {error}")
