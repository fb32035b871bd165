"""Snakemake adapter for rule evaluate_acceptance: offline acceptance on the held-out stores."""

from eyrie.common.adapter import rule_log
from eyrie.evaluate.stage import run_evaluate

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm):
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
        progress=True,  # a line in the job's log every few seconds
    )
    print(f"acc {rec['acc']}; tau {rec['tau']:.3f}, with bonus {rec['tau_with_bonus']:.3f}")
