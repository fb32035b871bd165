"""`eyrie draft-vocab | train | export | check-export`: the training stage outside Snakemake.

One module serves the four subcommands; which one is read from the parser's program name
(``eyrie NAME``), as eyrie/cli/main.py builds it. Paths default to the config's layout:
{results}/store/SPLIT/shard-NNN.zarr, {results}/draft_vocab/, {results}/train/,
{results}/export/ENGINE (eyrie.common.layout). ``torchrun --nproc_per_node N -m eyrie.cli.main
train ...`` trains with DDP.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from eyrie.common.errors import EyrieError
from eyrie.common.hf_config import text_config
from eyrie.common.layout import Layout, configured_stores

COMMANDS = ("draft-vocab", "train", "export", "check-export")


def _target_text(target) -> dict:
    """The language model's keys of a target folder's config.json."""
    return text_config(json.loads((Path(target) / "config.json").read_text()))


def add_arguments(parser) -> None:
    name = parser.prog.split()[-1]
    if name not in COMMANDS:
        raise SystemExit(f"eyrie.cli.train serves {COMMANDS}, not {name!r}")
    parser.set_defaults(_train_command=name)
    if name != "check-export":
        parser.add_argument("--config", default="config.yaml", help="workflow config")
    if name == "draft-vocab":
        parser.add_argument("--stores", nargs="+", help="train stores (default: the config's)")
        parser.add_argument("--target", help="target folder (default: target.path)")
        parser.add_argument("--size", type=int, help="draft vocabulary size (draft_vocab.size)")
        parser.add_argument(
            "--out", help="vocab file (default {results}/draft_vocab/vocab.safetensors)"
        )
    elif name == "train":
        parser.add_argument("--train-stores", nargs="+", help="default: the config's train stores")
        parser.add_argument("--heldout-stores", nargs="*", help="default: the heldout stores")
        parser.add_argument("--target", help="target folder (default: target.path)")
        parser.add_argument("--vocab", help="draft vocabulary (default: {results}/draft_vocab/)")
        parser.add_argument("--out", help="output folder (default {results}/train)")
        parser.add_argument("--work", help="checkpoints and live metrics (default OUT/work)")
        parser.add_argument("--threads", type=int, help="CPU threads for torch")
        parser.add_argument("--max-steps", type=int, help="override train.max_steps")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    elif name == "export":
        parser.add_argument("--drafter", help="trained drafter (default {results}/train/drafter)")
        parser.add_argument(
            "--engine",
            choices=["sglang", "vllm"],
            action="append",
            help="engine form(s) to write (default: export.engines)",
        )
        parser.add_argument("--out", help="output root (default {results}/export); ENGINE below")
        parser.add_argument("--vocab", help="draft vocabulary to check d2t against")
        parser.add_argument("--report", help="write a JSON summary of the exports here")
        parser.add_argument("--target", help="target folder (default: target.path)")
    else:
        parser.add_argument("folder", help="an exported drafter folder")
        parser.add_argument("--engine", choices=["sglang", "vllm"], required=True)
        parser.add_argument("--target", help="target folder (default: from eyrie-export.json)")
        parser.add_argument(
            "--aux-layer-ids",
            type=int,
            nargs="+",
            help="trained aux ids, output of layer i (default: eyrie-export.json)",
        )
        parser.add_argument(
            "--sglang-rule",
            choices=["plus_one", "as_is", "plus_one_if_first_is_1"],
            help="SGLang's layer-id rule (default: eyrie-export.json's, else plus_one)",
        )
        parser.add_argument("--drafter", help="trained drafter folder to compare weights with")


def run(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cmd = args._train_command
    try:
        if cmd == "check-export":
            return _check(args)
        from eyrie.common.config import load

        cfg = load(args.config)
        return {"draft-vocab": _vocab, "train": _train, "export": _export}[cmd](args, cfg)
    except (EyrieError, FileNotFoundError) as exc:  # each names the input and the fix
        print(f"eyrie {cmd}: {exc}", file=sys.stderr)
        return 1


def _vocab(args, cfg) -> int:
    from eyrie.target.load import configured_dir
    from eyrie.train import vocab as draft_vocab

    target = Path(args.target or configured_dir(cfg))
    stores = args.stores or configured_stores(cfg, "train")
    vocab_size = int(_target_text(target)["vocab_size"])
    size = min(int(args.size or cfg["draft_vocab"]["size"]), vocab_size)
    counts = draft_vocab.count_tokens(stores, vocab_size)
    vocab = draft_vocab.build(counts, size)
    out = Path(args.out or Layout.of(cfg).vocab())
    summary = draft_vocab.save(
        vocab, out, {"stores": [str(s) for s in stores], "target": str(target)}
    )
    print(f"{out}: {summary['draft_vocab_size']} tokens, coverage {summary['coverage']:.4f}")
    return 0


def _train(args, cfg) -> int:
    import torch

    from eyrie.target.load import configured_dir
    from eyrie.train.trainer import train

    if args.threads:
        torch.set_num_threads(args.threads)
    settings = dict(cfg["train"])
    if args.max_steps:
        settings["max_steps"] = args.max_steps
    layout = Layout.of(cfg)
    out = Path(args.out or layout.train_dir())
    heldout = (
        args.heldout_stores
        if args.heldout_stores is not None
        else configured_stores(cfg, "heldout")
    )
    summary = train(
        train_stores=args.train_stores or configured_stores(cfg, "train"),
        heldout_stores=heldout,
        target_dir=args.target or configured_dir(cfg),
        vocab_path=args.vocab or layout.vocab(),
        out_dir=out,
        work_dir=args.work,
        settings=settings,
        progress=not args.no_progress,
    )
    held = summary["heldout"] or {}
    if held and int(os.environ.get("RANK", "0")) == 0:
        accs = ", ".join(f"{a:.3f}" for a in held["acc"])
        print(f"{out}: {summary['steps']} steps; held-out acc per step [{accs}]")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


def _export(args, cfg) -> int:
    from eyrie.common.atomic import write_json
    from eyrie.export.drafter import export
    from eyrie.target.load import configured_dir
    from eyrie.train.vocab import load as load_vocab

    layout = Layout.of(cfg)
    drafter = Path(args.drafter or layout.drafter())
    vocab = Path(args.vocab or layout.vocab())
    tokens = load_vocab(vocab).draft_tokens if vocab.is_file() else None
    ex = cfg["export"]
    out_root = Path(args.out) if args.out else None
    records = {}
    for engine in args.engine or ex["engines"]:
        out = out_root / engine if out_root else layout.export(engine)
        records[engine] = export(
            drafter,
            out,
            engine,
            sglang_rule=ex["sglang_layer_id_rule"],
            dtype=ex["dtype"],
            speculative_tokens=ex["speculative_tokens"],
            draft_tokens=tokens,
            target_dir=args.target or configured_dir(cfg),
            verifier=ex["verifier_name"],
        )
        ids = records[engine]["config_layer_ids"]
        print(f"{out}: {engine} export checked; config layer ids {ids}")
    if args.report:
        write_json(args.report, {"ok": True, "exports": records})
    return 0


def _check(args) -> int:
    from eyrie.export.check import EXPORT_META, Expectation, check_export
    from eyrie.train.saved import read_drafter

    folder = Path(args.folder)
    meta = (
        json.loads((folder / EXPORT_META).read_text()) if (folder / EXPORT_META).is_file() else {}
    )
    reference, ids = None, args.aux_layer_ids
    if args.drafter:
        dmeta, reference = read_drafter(args.drafter)
        ids = ids or dmeta["aux_layer_ids"]
    ids = ids or meta.get("trained_aux_layer_ids")
    embed = None
    if args.target:
        text = _target_text(args.target)
        if args.engine == "vllm":  # the shipped embedding must be this target's
            from eyrie.export.drafter import target_embedding

            embed = target_embedding(args.target, int(text["vocab_size"]), int(text["hidden_size"]))
    else:
        text = meta.get("target")
    if not ids or not text:
        print(
            f"eyrie check-export: {folder} has no {EXPORT_META}; pass --target and "
            "--aux-layer-ids (the trained layers, output of layer i)",
            file=sys.stderr,
        )
        return 2
    rule = args.sglang_rule or meta.get("sglang_layer_id_rule") or "plus_one"
    problems = check_export(
        folder,
        Expectation.of_target(
            args.engine,
            ids,
            text,
            sglang_rule=rule,
            reference=reference,
            target_embedding=embed,
        ),
    )
    if problems:
        print(f"{folder}: REFUSED for {args.engine}", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    how = f", SGLang rule {rule}" if args.engine == "sglang" else ""
    print(f"{folder}: ok for {args.engine} (serves layers {sorted(ids)}{how})")
    return 0
