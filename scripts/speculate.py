"""Snakemake adapter for rule evaluate_speculate: plain vs speculative decoding, transformers."""

from eyrie.common.adapter import rule_log
from eyrie.evaluate.settings import evaluate_settings
from eyrie.evaluate.stage import run_speculate

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm):
    rec = run_speculate(
        target_dir=sm.params.target,
        drafter_dir=sm.params.drafter,
        prompts_jsonl=sm.input.prompts,
        settings=evaluate_settings(sm.params.evaluate),
        out_json=sm.output.json,
        architecture=sm.params.architecture,
        progress=True,  # a line in the job's log every few seconds
    )
    print(
        f"plain {rec['plain_tokens_per_s']:.1f} tok/s, speculative "
        f"{rec['spec_tokens_per_s']:.1f} tok/s ({rec['speedup']:.2f}x, median of "
        f"{rec['repeats']} interleaved repeats, {rec['speedup_min']:.2f}-"
        f"{rec['speedup_max']:.2f}x), accept length "
        f"{rec['accept_length']:.2f}; identical {rec['identical']}/{rec['prompts']}"
    )
