"""Snakemake adapter for rule evaluate_speculate: plain vs speculative decoding, transformers."""

from eyrie.common.adapter import rule_log
from eyrie.evaluate.stage import run_speculate

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

ev = sm.params.evaluate
with rule_log(sm):
    rec = run_speculate(
        target_dir=sm.params.target,
        drafter_dir=sm.params.drafter,
        prompts_jsonl=sm.input.prompts,
        prompts=ev["prompts"],
        max_new_tokens=ev["max_new_tokens"],
        draft_tokens=ev["draft_tokens"],
        topk=ev["topk"],
        verify_tokens=ev["verify_tokens"],
        device=ev["device"],
        dtype=ev["dtype"],
        out_json=sm.output.json,
        architecture=sm.params.architecture,
        repeats=ev["repeats"],
        progress=True,  # a line in the job's log every few seconds
    )
    print(
        f"plain {rec['plain_tokens_per_s']:.1f} tok/s, speculative "
        f"{rec['spec_tokens_per_s']:.1f} tok/s ({rec['speedup']:.2f}x, median of "
        f"{rec['repeats']} interleaved repeats, {rec['speedup_min']:.2f}-"
        f"{rec['speedup_max']:.2f}x), accept length "
        f"{rec['accept_length']:.2f}; identical {rec['identical']}/{rec['prompts']}"
    )
