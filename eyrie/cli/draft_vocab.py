"""`eyrie draft-vocab`: the draft vocabulary (d2t, t2d) from train stores, outside Snakemake.

Paths default to the config's layout (eyrie.common.layout): the train stores
{results}/store/train/shard-NNN.zarr and {results}/draft_vocab/vocab.safetensors; the step is
eyrie/train/stage.py's draft_vocab, as rule draft_vocab runs it.
"""

from __future__ import annotations

from pathlib import Path

from eyrie.cli.config import stage_config
from eyrie.common.layout import Layout, configured_stores


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="config.yaml", help="workflow config")
    parser.add_argument("--stores", nargs="+", help="train stores (default: the config's)")
    parser.add_argument("--target", help="target folder (default: target.path)")
    parser.add_argument("--size", type=int, help="draft vocabulary size (draft_vocab.size)")
    parser.add_argument(
        "--out", help="vocab file (default {results}/draft_vocab/vocab.safetensors)"
    )


def run(args) -> int:
    from eyrie.target.load import configured_dir
    from eyrie.train.stage import draft_vocab

    cfg = stage_config(args)
    out = Path(args.out or Layout.of(cfg).vocab())
    summary = draft_vocab(
        stores=args.stores or configured_stores(cfg, "train"),
        target_config=Path(args.target or configured_dir(cfg)) / "config.json",
        size=args.size or cfg["draft_vocab"]["size"],
        out=out,
    )
    print(f"{out}: {summary['draft_vocab_size']} tokens, coverage {summary['coverage']:.4f}")
    return 0
