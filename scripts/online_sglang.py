"""Snakemake adapter for rule evaluate_sglang: SGLang's own acceptance and speed, or a
"not run" record naming why (another capture backend, no GPU, no sglang, no SGLang export)."""

from eyrie.common.adapter import rule_log
from eyrie.common.atomic import write_json
from eyrie.common.errors import known_errors
from eyrie.evaluate.online import not_run
from eyrie.evaluate.settings import evaluate_settings
from eyrie.evaluate.stage import run_online

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with rule_log(sm, threads=False):
    try:
        if sm.params.backend == "sglang" and not sm.params.draft:
            rec = not_run("export.engines has no sglang: there is no SGLang drafter to serve")
            write_json(sm.output.json, rec, default=str)
        else:
            rec = run_online(
                backend=sm.params.backend,
                target_dir=sm.params.target,
                draft_dir=sm.params.draft,
                prompts_jsonl=sm.input.prompts,
                settings=evaluate_settings(sm.params.evaluate),
                out_json=sm.output.json,
                log_dir=sm.params.log_dir,
                if_possible=True,
            )
        print(rec.get("reason") or f"speedup {rec['speedup']:.2f}, accept {rec['accept_length']}")
    except known_errors() as exc:  # the EyrieErrors rule_log ends the job with, and a missing file
        print(f"error: {exc}")
        raise SystemExit(f"error: {exc}") from None
