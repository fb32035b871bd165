"""`eyrie evaluate`: offline acceptance of the trained drafter on the held-out stores, outside
Snakemake (eyrie.evaluate.acceptance).

Paths default to the config's layout under {results} (eyrie.common.layout); the step is
eyrie/evaluate/stage.py's run_evaluate, as rule evaluate_acceptance runs it.
"""

from __future__ import annotations

from pathlib import Path

from eyrie.cli.config import stage_config
from eyrie.common.layout import Layout, configured_stores


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="config.yaml", help="workflow config")
    parser.add_argument("--drafter", help="trained drafter (default {results}/train/drafter)")
    parser.add_argument("--stores", nargs="+", help="held-out stores (default: the config's)")
    parser.add_argument("--target", help="target folder (default: target.path)")
    parser.add_argument("--steps", type=int, help="draft positions (evaluate.steps)")
    parser.add_argument("--out", help="output folder (default {results}/evaluate)")
    parser.add_argument("--threads", type=int, help="CPU threads for torch")


def run(args) -> int:
    from eyrie.evaluate.stage import evaluation_steps, run_evaluate
    from eyrie.target.load import configured_dir

    cfg = stage_config(args)
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
