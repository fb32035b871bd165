"""The evaluation stage's steps, as the workflow's rules and the `eyrie` subcommands run them.

Each ``run_*`` takes plain paths and settings (run_speculate and run_online the evaluate
section typed once, eyrie/evaluate/settings.py), runs one measurement and writes its record:

- run_evaluate: offline acceptance on the held-out stores (eyrie/evaluate/acceptance.py);
- run_speculate: plain vs speculative greedy decoding in-process, interleaved prompt by prompt
  and repeated, every turn of a multi-turn prompt (eyrie/evaluate/compare.py; decoding in
  eyrie/evaluate/speculate.py and tree.py, the target and drafter pair and the prompts from
  loading.py);
- run_online: SGLang's own measurement with and without the drafter (eyrie/evaluate/online.py:
  measure_servers);
- run_report: figures and summary.md from the records (eyrie/evaluate/report.py).

The Snakemake adapters in scripts/ and the subcommands (eyrie/cli/evaluate.py, speculate.py,
report.py) call these, so a rule and a subcommand give the same record.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from eyrie.common.atomic import write_json, write_text
from eyrie.common.device import pick_device
from eyrie.common.provenance import machine

if TYPE_CHECKING:
    from eyrie.evaluate.settings import EvaluateSettings


def evaluation_steps(steps, ttt_steps) -> int:
    """The draft positions scored offline: ``steps`` (evaluate.steps, or a command line's), else
    the drafter's training unroll (train.ttt_steps), so acceptance is read where it was trained.
    The rule, the subcommand and run_evaluate all ask here."""
    return int(steps or ttt_steps or 1)


def run_evaluate(
    *,
    drafter_dir,
    target_dir,
    stores,
    steps,
    batch_size,
    max_len,
    device,
    out_json,
    out_csv,
    progress=False,
) -> dict:
    """Offline acceptance into a JSON summary and a per-position CSV table."""
    from eyrie.evaluate.acceptance import evaluate_stores, load_drafter

    dev = pick_device(device, "evaluate.device")
    drafter, meta = load_drafter(drafter_dir, dev)
    if meta.get("method") == "dflash":  # every draft of the block, as SGLang verifies them
        steps = int(meta["config"]["block_size"]) - 1
    steps = evaluation_steps(steps, meta["train"]["settings"].get("ttt_steps"))
    m = evaluate_stores(
        drafter,
        meta["aux_layer_ids"],
        target_dir,
        [str(s) for s in stores],
        steps=steps,
        batch_size=batch_size,
        max_len=max_len,
        device=dev,
        progress=progress,
    )
    record = {
        **m.to_dict(),
        "drafter": str(drafter_dir),
        "stores": [str(s) for s in stores],
        "target_greedy": "argmax of the target's lm_head over the stored final hidden states",
        "definitions": {
            "acc": "P(draft k right) over every row scored at step k (the training metric)",
            "cond_acc": "P(draft k right | drafts 0..k-1 right), over full chains",
            "chain": "P(drafts 0..k all right), over full chains",
            "tau": "expected drafts accepted per verify step with `steps` drafts, no bonus",
            "tau_with_bonus": "tau + 1: tokens emitted per verify step",
            "lookup_rows": "acc_0 on the step-0 rows whose greedy token the context lookup "
            "names (share: of all step-0 rows) and on the other rows",
        },
    }
    write_text(out_csv, m.table().to_csv(index=False))
    write_json(out_json, record, default=str)
    return record


def run_speculate(
    *,
    target_dir,
    drafter_dir,
    prompts_jsonl,
    settings: EvaluateSettings,
    out_json,
    architecture=None,
    progress=False,
) -> dict:
    """The transformers loop: plain vs speculative greedy decoding, with the machine; the
    speed-up is the median of evaluate.repeats interleaved passes (eyrie/evaluate/compare.py)."""
    from eyrie.evaluate import loading
    from eyrie.evaluate.compare import compare

    s = settings
    draft_tokens, topk, verify_tokens = s.draft_tokens, s.topk, s.verify_tokens
    dev = pick_device(s.device, "evaluate.device")
    target, runner, tokenizer, meta = loading.load_pair(
        target_dir, drafter_dir, dev, s.dtype, architecture
    )
    if meta.get("method") == "dflash":  # one chain: the block's drafts, as SGLang serves it
        draft_tokens, topk, verify_tokens = int(meta["config"]["block_size"]) - 1, 1, None
    try:
        ps = loading.load_prompts(prompts_jsonl, tokenizer, s.prompts)
        result = compare(
            target,
            runner,
            ps,
            k=draft_tokens,
            max_new_tokens=s.max_new_tokens,
            eos=loading.eos_ids(tokenizer, target.model.config),
            repeats=s.repeats,
            topk=topk,
            verify_tokens=verify_tokens,
            progress=progress,
            tokenizer=tokenizer,
        )
    finally:
        target.close()
    result.update(
        {
            "backend": "hf",
            "device": str(dev),
            "dtype": s.dtype,
            "method": meta.get("method", "eagle3"),
            "draft_layers": meta["config"].get("num_hidden_layers", 1),
            "max_new_tokens": s.max_new_tokens,
            "machine": machine(),
            "target": str(target_dir),
            "drafter": str(drafter_dir),
        }
    )
    if out_json:
        write_json(out_json, result, default=str)
    return result


def run_online(
    *,
    backend,
    target_dir,
    draft_dir,
    prompts_jsonl,
    settings: EvaluateSettings,
    out_json,
    log_dir,
    if_possible=False,
) -> dict:
    """SGLang with and without the exported drafter (one EAGLE-3 server per entry of
    evaluate.sglang.settings; null: the one draft_tokens/topk/verify_tokens give) on
    ``settings.served_prompts`` prompts; with ``if_possible``, a 'not run' record naming the
    reason where it cannot run (no GPU, another capture backend, no sglang)."""
    from eyrie.evaluate import online

    reason = online.why_not(backend)
    if reason is not None:
        if not if_possible:
            raise online.OnlineError(f"the online SGLang measurement cannot run: {reason}")
        record = online.not_run(reason)
    else:
        from eyrie.evaluate.loading import load_prompts
        from eyrie.target.load import load_tokenizer

        tokenizer = load_tokenizer(target_dir)
        s, serving = settings, settings.sglang
        ps = load_prompts(prompts_jsonl, tokenizer, s.served_prompts)
        server_args = serving.server_args
        t0 = time.time()
        record = online.measure_servers(
            target_dir,
            draft_dir,
            ps,
            max_new_tokens=s.max_new_tokens,
            draft_tokens=s.draft_tokens,
            topk=s.topk,
            verify_tokens=s.verify_tokens,
            settings=online.dflash_settings(draft_dir) or serving.settings,
            tokenizer=tokenizer,
            log_dir=log_dir,
            launch_timeout=serving.launch_timeout_s,
            server_args=online.DEFAULT_SERVER_ARGS if server_args is None else list(server_args),
            cuda_graph=serving.cuda_graph,
        )
        record["wall_seconds"] = time.time() - t0
        record["machine"] = machine()
    write_json(out_json, record, default=str)
    return record


def run_report(*, out_dir, figures=None, **records) -> dict:
    """Figures and summary.md (verdict first) from whichever records exist; ``records`` are
    eyrie.evaluate.report.read_inputs's (acceptance, speculate, online, train_metrics, ...)."""
    from eyrie.evaluate.report import build_report, read_inputs

    return build_report(read_inputs(**records), out_dir, figures)
