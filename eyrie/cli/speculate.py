"""`eyrie speculate`: speculative vs plain greedy decoding of held-out prompts, outside
Snakemake: in-process with transformers (``--backend hf``) or with two SGLang servers
(``--backend sglang``, GPU).

Paths default to the config's layout under {results} (eyrie.common.layout); the steps are
eyrie/evaluate/stage.py's run_speculate and run_online, as rules evaluate_speculate and
evaluate_sglang run them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from eyrie.cli.config import stage_config
from eyrie.common.layout import Layout


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="config.yaml", help="workflow config")
    parser.add_argument(
        "--backend",
        choices=["hf", "sglang"],
        default="hf",
        help="hf: transformers in-process; sglang: two servers (GPU)",
    )
    parser.add_argument(
        "--drafter",
        help="hf: trained drafter folder; sglang: exported "
        "SGLang folder (defaults {results}/train/drafter, {results}/export/"
        "sglang)",
    )
    parser.add_argument("--target", help="target folder (default: target.path)")
    parser.add_argument("--prompts-jsonl", help="chat JSONL (default {results}/data/heldout.jsonl)")
    parser.add_argument("--prompts", type=int, help="prompts (evaluate.prompts)")
    parser.add_argument("--max-new-tokens", type=int, help="evaluate.max_new_tokens")
    parser.add_argument("--draft-tokens", type=int, help="k (evaluate.draft_tokens)")
    parser.add_argument("--topk", type=int, help="tree branches per step (evaluate.topk)")
    parser.add_argument(
        "--verify-tokens", type=int, help="tokens a tree verifies (evaluate.verify_tokens)"
    )
    parser.add_argument("--device", help="hf: auto | cpu | cuda (evaluate.device)")
    parser.add_argument("--dtype", help="hf: float32 | bfloat16 | float16 (evaluate.dtype)")
    parser.add_argument(
        "--repeats", type=int, help="hf: interleaved timing passes (evaluate.repeats)"
    )
    parser.add_argument("--out", help="JSON result (default {results}/evaluate/NAME.json)")
    parser.add_argument("--threads", type=int, help="CPU threads for torch")


def run(args) -> int:
    from eyrie.evaluate.settings import evaluate_settings
    from eyrie.evaluate.stage import run_online, run_speculate
    from eyrie.target.load import configured_dir

    cfg = stage_config(args)
    ev, layout = evaluate_settings(cfg["evaluate"]), Layout.of(cfg)
    ev = replace(
        ev,
        prompts=args.prompts or ev.prompts,
        max_new_tokens=args.max_new_tokens or ev.max_new_tokens,
        draft_tokens=args.draft_tokens or ev.draft_tokens,
        topk=args.topk or ev.topk,
        # a chain asked for on the command line verifies k + 1, whatever the config's tree says
        verify_tokens=args.verify_tokens or (None if args.topk == 1 else ev.verify_tokens),
        device=args.device or ev.device,
        dtype=args.dtype or ev.dtype,
        repeats=args.repeats or ev.repeats,
        sglang=replace(
            ev.sglang,
            prompts=args.prompts or ev.sglang.prompts,
            # a draft asked for on the command line replaces the config's served settings
            settings=None if args.draft_tokens or args.topk else ev.sglang.settings,
        ),
    )
    common = dict(
        target_dir=args.target or configured_dir(cfg),
        prompts_jsonl=args.prompts_jsonl or layout.dataset("heldout"),
        settings=ev,
    )
    if args.backend == "sglang":
        out = Path(args.out or layout.evaluate_dir() / "online_sglang.json")
        rec = run_online(
            backend="sglang",
            draft_dir=args.drafter or layout.export("sglang"),
            out_json=out,
            log_dir=out.parent / "sglang-logs",
            **common,
        )
    else:
        out = Path(args.out or layout.evaluate_dir() / "speculate.json")
        rec = run_speculate(
            drafter_dir=args.drafter or layout.drafter(),
            out_json=out,
            architecture=cfg["target"]["architecture"],
            **common,
        )
    spread = ""
    if rec.get("repeats"):  # the transformers loop: the median of interleaved repeats
        spread = (
            f" (median of {rec['repeats']} interleaved repeats, {rec['speedup_min']:.2f}-"
            f"{rec['speedup_max']:.2f})"
        )
    print(
        f"{out}: plain {rec['plain_tokens_per_s']:.1f} tok/s, speculative "
        f"{rec['spec_tokens_per_s']:.1f} tok/s, ratio {rec['speedup']:.2f}{spread}, accept "
        f"length {rec['accept_length']:.2f}; identical outputs {rec['identical']}/{rec['prompts']}"
    )
    return 0
