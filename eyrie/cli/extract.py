"""`eyrie extract`: capture one shard of one split into a shard store, outside Snakemake."""

from __future__ import annotations

import logging
from pathlib import Path

from eyrie.cli.config import load_for
from eyrie.common.layout import Layout, shard_name


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="config.yaml", help="workflow config (config.yaml)")
    parser.add_argument("--split", required=True, help="train or heldout")
    parser.add_argument("--shard", type=int, required=True, help="shard index, 0-based")
    parser.add_argument("--data", help="prepared split file (default {results}/data/SPLIT.jsonl)")
    parser.add_argument(
        "--store", help="output store (default {results}/store/SPLIT/shard-NNN.zarr)"
    )
    parser.add_argument("--errors", help="errors table (default beside the store)")
    parser.add_argument("--commit-every", type=int, default=64, help="samples per commit")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    """Errors of the stage (EyrieError) reach eyrie.cli.main, which prints them once."""
    from eyrie.extract.shard import extract_shard
    from eyrie.target.load import configured_dir

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = load_for("extract", args.config)
    if cfg is None:
        return 2
    layout = Layout.of(cfg)
    store = Path(args.store or layout.store(args.split, args.shard))
    errors = Path(args.errors or store.with_name(f"{shard_name(args.shard)}.errors.csv"))
    out = extract_shard(
        data_path=args.data or layout.conversations(cfg, args.split),
        target_path=configured_dir(cfg),
        architecture=cfg["target"].get("architecture"),
        split=args.split,
        shard=args.shard,
        out_store=store,
        errors_csv=errors,
        capture=cfg["capture"],
        extract=cfg["extract"],
        max_tokens=cfg["dataset"]["max_tokens"],
        commit_every=args.commit_every,
        weights_cache=layout.sha256_cache(),
        progress=not args.no_progress,
    )
    cut = f", {out.truncated} cut at dataset.max_tokens" if out.truncated else ""
    print(f"{out.store}: {out.samples} samples{cut}, {out.tokens} tokens, errors {out.errors}")
    return 0
