"""`eyrie extract`: capture one shard of one split into a shard store, outside Snakemake."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from eyrie.common.config import ConfigError, load


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
    from eyrie.data.chat_tokens import SampleError
    from eyrie.extract.shard import ExtractError, extract_shard
    from eyrie.store.shard import StoreError
    from eyrie.target.load import TargetError, configured_dir

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = load(args.config)
    except ConfigError as exc:
        print(f"eyrie extract: {exc}", file=sys.stderr)
        return 2
    results = Path(cfg["results"])
    name = f"shard-{args.shard:03d}"
    store = Path(args.store or results / "store" / args.split / f"{name}.zarr")
    errors = Path(args.errors or store.with_name(f"{name}.errors.csv"))
    try:
        out = extract_shard(
            data_path=args.data or results / "data" / f"{args.split}.jsonl",
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
            weights_cache=results / "store" / ".weights-sha256.json",
            progress=not args.no_progress,
        )
    except (ExtractError, TargetError, StoreError, SampleError) as exc:
        print(f"eyrie extract: {exc}", file=sys.stderr)
        return 1
    cut = f", {out.truncated} cut at dataset.max_tokens" if out.truncated else ""
    print(f"{out.store}: {out.samples} samples{cut}, {out.tokens} tokens, errors {out.errors}")
    return 0
