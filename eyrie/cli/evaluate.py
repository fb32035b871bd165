"""`eyrie evaluate | speculate | report`: the evaluation stage outside Snakemake.

- evaluate: offline acceptance of the trained drafter on the held-out stores
  (eyrie.evaluate.acceptance)
- speculate: speculative vs plain greedy decoding of held-out prompts, in-process with
  transformers (``--backend hf``) or with two SGLang servers (``--backend sglang``, GPU)
- report: figures and summary.md from whatever the run produced (eyrie.evaluate.report)

One module serves the three; which one is read from the parser's program name (``eyrie NAME``),
as eyrie/cli/main.py builds it. Paths default to the config's layout under {results}
(eyrie.common.layout); the steps themselves are eyrie/evaluate/stage.py's.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from eyrie.common.errors import known_errors
from eyrie.common.layout import SPLITS, Layout, configured_stores
from eyrie.evaluate.stage import (
    evaluation_steps,
    run_evaluate,
    run_online,
    run_report,
    run_speculate,
)

COMMANDS = ("evaluate", "speculate", "report")

# what the rules and the subcommands run


# ---------------------------------------------------------------------------------------------
# command line


def add_arguments(parser) -> None:
    name = parser.prog.split()[-1]
    if name not in COMMANDS:
        raise SystemExit(f"eyrie.cli.evaluate serves {COMMANDS}, not {name!r}")
    parser.set_defaults(_eval_command=name)
    parser.add_argument("--config", default="config.yaml", help="workflow config")
    if name == "evaluate":
        parser.add_argument("--drafter", help="trained drafter (default {results}/train/drafter)")
        parser.add_argument("--stores", nargs="+", help="held-out stores (default: the config's)")
        parser.add_argument("--target", help="target folder (default: target.path)")
        parser.add_argument("--steps", type=int, help="draft positions (evaluate.steps)")
        parser.add_argument("--out", help="output folder (default {results}/evaluate)")
        parser.add_argument("--threads", type=int, help="CPU threads for torch")
    elif name == "speculate":
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
        parser.add_argument(
            "--prompts-jsonl", help="chat JSONL (default {results}/data/heldout.jsonl)"
        )
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
    else:
        parser.add_argument("--out", help="report folder (default {results}/report)")


def run(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cmd = args._eval_command
    try:
        from eyrie.common.config import load

        cfg = load(args.config)
        return {"evaluate": _evaluate, "speculate": _speculate, "report": _report}[cmd](args, cfg)
    except known_errors() as exc:  # each carries a message naming the input and the fix
        print(f"eyrie {cmd}: {exc}", file=sys.stderr)
        return 1


def _threads(args) -> None:
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)


def _evaluate(args, cfg) -> int:
    from eyrie.target.load import configured_dir

    _threads(args)
    ev, layout = cfg["evaluate"], Layout.of(cfg)
    out = Path(args.out or layout.evaluate_dir())
    rec = run_evaluate(
        drafter_dir=args.drafter or layout.drafter(),
        target_dir=args.target or configured_dir(cfg),
        stores=args.stores or configured_stores(cfg, "heldout"),
        steps=evaluation_steps(args.steps or ev["steps"], cfg["train"]["ttt_steps"]),
        batch_size=ev["batch_size"],
        max_len=cfg["train"]["max_len"],
        device=ev["device"],
        out_json=out / "acceptance.json",
        out_csv=out / "acceptance.csv",
        progress=True,
    )
    accs = ", ".join(f"{a:.3f}" for a in rec["acc"])
    print(f"{out}/acceptance.json: acc per position [{accs}]; tau {rec['tau']:.3f} "
          f"(+1 bonus: {rec['tau_with_bonus']:.3f})")  # fmt: skip
    return 0


def _speculate(args, cfg) -> int:
    from eyrie.target.load import configured_dir

    _threads(args)
    ev, layout = cfg["evaluate"], Layout.of(cfg)
    common = dict(
        target_dir=args.target or configured_dir(cfg),
        prompts_jsonl=args.prompts_jsonl or layout.dataset("heldout"),
        prompts=args.prompts or ev["prompts"],
        max_new_tokens=args.max_new_tokens or ev["max_new_tokens"],
        draft_tokens=args.draft_tokens or ev["draft_tokens"],
        topk=args.topk or ev["topk"],
        # a chain asked for on the command line verifies k + 1, whatever the config's tree says
        verify_tokens=args.verify_tokens or (None if args.topk == 1 else ev["verify_tokens"]),
    )
    if args.backend == "sglang":
        out = Path(args.out or layout.evaluate_dir() / "online_sglang.json")
        rec = run_online(
            backend="sglang",
            draft_dir=args.drafter or layout.export("sglang"),
            out_json=out,
            log_dir=out.parent / "sglang-logs",
            launch_timeout=ev["sglang"]["launch_timeout_s"],
            server_args=ev["sglang"]["server_args"],
            cuda_graph=ev["sglang"]["cuda_graph"],
            # a draft asked for on the command line replaces the config's served settings
            settings=None if args.draft_tokens or args.topk else ev["sglang"]["settings"],
            **{**common, "prompts": args.prompts or ev["sglang"]["prompts"] or ev["prompts"]},
        )
    else:
        out = Path(args.out or layout.evaluate_dir() / "speculate.json")
        rec = run_speculate(
            drafter_dir=args.drafter or layout.drafter(),
            device=args.device or ev["device"],
            dtype=args.dtype or ev["dtype"],
            out_json=out,
            architecture=cfg["target"]["architecture"],
            repeats=args.repeats or ev["repeats"],
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


def _report(args, cfg) -> int:
    layout = Layout.of(cfg)
    ev = layout.evaluate_dir()
    written = run_report(
        out_dir=args.out or layout.report_dir(),
        acceptance=ev / "acceptance.json",
        speculate=ev / "speculate.json",
        online=ev / "online_sglang.json",
        train_metrics=layout.train_dir() / "metrics.csv",
        validate=layout.validate_dir() / "summary.csv",
        baselines=ev / "baselines.json",
        problems=[layout.problems(split) for split in SPLITS],
    )
    print(Path(written["summary"]).read_text().splitlines()[0])
    print(f"written: {', '.join(str(p) for p in written.values())}")
    return 0
