"""`eyrie train`: train the drafter on shard stores, outside Snakemake.

Paths default to the config's layout (eyrie.common.layout): the train and held-out stores,
{results}/draft_vocab/ and {results}/train/; the step is eyrie/train/stage.py's run_train, as
rule train_drafter runs it. It trains in this process: ``torchrun --nproc_per_node N -m
eyrie.cli.main train ...`` (or ``python -m eyrie.train.launch --processes N -- ...``) trains
with DDP.
"""

from __future__ import annotations

from pathlib import Path

from eyrie.cli.config import stage_config
from eyrie.common.layout import Layout, configured_stores


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="config.yaml", help="workflow config")
    parser.add_argument("--train-stores", nargs="+", help="default: the config's train stores")
    parser.add_argument("--heldout-stores", nargs="*", help="default: the heldout stores")
    parser.add_argument("--target", help="target folder (default: target.path)")
    parser.add_argument("--vocab", help="draft vocabulary (default: {results}/draft_vocab/)")
    parser.add_argument("--out", help="output folder (default {results}/train)")
    parser.add_argument("--work", help="checkpoints and live metrics (default OUT/work)")
    parser.add_argument("--threads", type=int, help="CPU threads for torch")
    parser.add_argument("--max-steps", type=int, help="override train.max_steps")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    from eyrie.target.load import configured_dir
    from eyrie.train.stage import run_train, trained

    cfg = stage_config(args)
    settings = dict(cfg["train"])
    if args.max_steps:
        settings["max_steps"] = args.max_steps
    layout = Layout.of(cfg)
    out = Path(args.out or layout.train_dir())
    heldout = args.heldout_stores
    summary = run_train(
        train_stores=args.train_stores or configured_stores(cfg, "train"),
        heldout_stores=configured_stores(cfg, "heldout") if heldout is None else heldout,
        target_dir=args.target or configured_dir(cfg),
        vocab_path=args.vocab or layout.vocab(),
        out_dir=out,
        work_dir=args.work,
        settings=settings,
        progress=not args.no_progress,
    )
    line = trained(out, summary)
    if line:
        print(line)
    return 0
