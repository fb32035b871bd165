"""`eyrie evaluate | speculate | report`: the evaluation stage outside Snakemake.

- evaluate: offline acceptance of the trained drafter on the held-out stores (eyrie.evaluate.acceptance)
- speculate: speculative vs plain greedy decoding of held-out prompts, in-process with
  transformers (``--backend hf``) or with two SGLang servers (``--backend sglang``, GPU)
- report: figures and summary.md from whatever the run produced (eyrie.evaluate.report)

One module serves the three; which one is read from the parser's program name (``eyrie NAME``),
as eyrie/cli/main.py builds it. Paths default to the config's layout under {results}. The ``run_*``
functions are what the workflow's scripts call.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from eyrie.common.atomic import write_json, write_text

COMMANDS = ("evaluate", "speculate", "report")


# ---------------------------------------------------------------------------------------------
# what the rules and the subcommands run


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
    from eyrie.evaluate.speculate import pick_device

    dev = pick_device(device)
    drafter, meta = load_drafter(drafter_dir, dev)
    steps = int(steps or meta["train"]["settings"].get("ttt_steps") or 1)
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
    prompts,
    max_new_tokens,
    draft_tokens,
    device,
    dtype,
    out_json,
    architecture=None,
    warmup=1,
) -> dict:
    """The transformers loop: plain vs speculative greedy decoding, with the machine."""
    from eyrie.evaluate import speculate as sp

    dev = sp.pick_device(device)
    target, runner, tokenizer, meta = sp.load_pair(
        target_dir, drafter_dir, dev, dtype, architecture
    )
    try:
        ps = sp.load_prompts(prompts_jsonl, tokenizer, prompts)
        result = sp.compare(
            target,
            runner,
            ps,
            k=draft_tokens,
            max_new_tokens=max_new_tokens,
            eos=sp.eos_ids(tokenizer, target.model.config),
            warmup=warmup,
        )
    finally:
        target.close()
    result.update(
        {
            "backend": "hf",
            "device": str(dev),
            "dtype": dtype,
            "max_new_tokens": max_new_tokens,
            "machine": sp.machine(),
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
    prompts,
    max_new_tokens,
    draft_tokens,
    out_json,
    log_dir,
    launch_timeout=600.0,
    server_args=None,
    cuda_graph=True,
    if_possible=False,
) -> dict:
    """SGLang with and without the exported drafter; with ``if_possible``, a 'not run' record
    naming the reason where it cannot run (no GPU, another capture backend, no sglang)."""
    from eyrie.evaluate import online as on

    reason = on.why_not(backend)
    if reason is not None:
        if not if_possible:
            raise on.OnlineError(f"the online SGLang measurement cannot run: {reason}")
        record = on.not_run(reason)
    else:
        from eyrie.evaluate.speculate import load_prompts
        from eyrie.target.load import load_tokenizer

        ps = load_prompts(prompts_jsonl, load_tokenizer(target_dir), prompts)
        t0 = time.time()
        record = on.run_online(
            target_dir,
            draft_dir,
            ps,
            max_new_tokens=max_new_tokens,
            draft_tokens=draft_tokens,
            log_dir=log_dir,
            launch_timeout=launch_timeout,
            server_args=on.DEFAULT_SERVER_ARGS if server_args is None else list(server_args),
            cuda_graph=cuda_graph,
        )
        record["wall_seconds"] = time.time() - t0
        from eyrie.evaluate.speculate import machine

        record["machine"] = machine()
    write_json(out_json, record, default=str)
    return record


def run_report(
    *,
    out_dir,
    acceptance=None,
    speculate=None,
    online=None,
    train_metrics=None,
    validate=None,
    figures=None,
    baselines=None,
) -> dict:
    from eyrie.evaluate.report import build_report, read_inputs

    inp = read_inputs(acceptance, speculate, online, train_metrics, validate, baselines)
    return build_report(inp, out_dir, figures)


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
        parser.add_argument("--device", help="hf: auto | cpu | cuda (evaluate.device)")
        parser.add_argument("--dtype", help="hf: float32 | bfloat16 | float16 (evaluate.dtype)")
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


def known_errors() -> tuple[type[Exception], ...]:
    """The failures with a plain message (shown as is); anything else is a bug to trace."""
    from eyrie.common.config import ConfigError
    from eyrie.evaluate.acceptance import AcceptanceError
    from eyrie.evaluate.online import OnlineError
    from eyrie.evaluate.speculate import SpeculateError
    from eyrie.store.shard import StoreError
    from eyrie.target.load import TargetError
    from eyrie.train.model import DrafterError

    return (AcceptanceError, ConfigError, DrafterError, OnlineError, SpeculateError, StoreError,
            TargetError, FileNotFoundError)  # fmt: skip


def _threads(args) -> None:
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)


def _stores(cfg: dict, split: str) -> list[Path]:
    root = Path(cfg["results"]) / "store" / split
    return [root / f"shard-{i:03d}.zarr" for i in range(cfg["extract"]["shards"])]


def _evaluate(args, cfg) -> int:
    from eyrie.target.load import configured_dir

    _threads(args)
    ev, results = cfg["evaluate"], Path(cfg["results"])
    out = Path(args.out or results / "evaluate")
    rec = run_evaluate(
        drafter_dir=args.drafter or results / "train" / "drafter",
        target_dir=args.target or configured_dir(cfg),
        stores=args.stores or _stores(cfg, "heldout"),
        steps=args.steps or ev["steps"] or cfg["train"]["ttt_steps"],
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
    ev, results = cfg["evaluate"], Path(cfg["results"])
    common = dict(
        target_dir=args.target or configured_dir(cfg),
        prompts_jsonl=args.prompts_jsonl or results / "data" / "heldout.jsonl",
        prompts=args.prompts or ev["prompts"],
        max_new_tokens=args.max_new_tokens or ev["max_new_tokens"],
        draft_tokens=args.draft_tokens or ev["draft_tokens"],
    )
    if args.backend == "sglang":
        out = Path(args.out or results / "evaluate" / "online_sglang.json")
        rec = run_online(
            backend="sglang",
            draft_dir=args.drafter or results / "export" / "sglang",
            out_json=out,
            log_dir=out.parent / "sglang-logs",
            launch_timeout=ev["sglang"]["launch_timeout_s"],
            server_args=ev["sglang"]["server_args"],
            cuda_graph=ev["sglang"]["cuda_graph"],
            **common,
        )
    else:
        out = Path(args.out or results / "evaluate" / "speculate.json")
        rec = run_speculate(
            drafter_dir=args.drafter or results / "train" / "drafter",
            device=args.device or ev["device"],
            dtype=args.dtype or ev["dtype"],
            out_json=out,
            architecture=cfg["target"]["architecture"],
            **common,
        )
    print(
        f"{out}: plain {rec['plain_tokens_per_s']:.1f} tok/s, speculative "
        f"{rec['spec_tokens_per_s']:.1f} tok/s, ratio {rec['speedup']:.2f}, accept length "
        f"{rec['accept_length']:.2f}; identical outputs {rec['identical']}/{rec['prompts']}"
    )
    return 0


def _report(args, cfg) -> int:
    results = Path(cfg["results"])
    ev = results / "evaluate"
    written = run_report(
        out_dir=args.out or results / "report",
        acceptance=ev / "acceptance.json",
        speculate=ev / "speculate.json",
        online=ev / "online_sglang.json",
        train_metrics=results / "train" / "metrics.csv",
        validate=results / "validate" / "summary.csv",
        baselines=ev / "baselines.json",
    )
    print(Path(written["summary"]).read_text().splitlines()[0])
    print(f"written: {', '.join(str(p) for p in written.values())}")
    return 0
