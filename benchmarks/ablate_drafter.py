"""Train drafter variants on one run's stores, same data, and print held-out acc_k and time.

    python benchmarks/ablate_drafter.py --name base --set epochs=1 lr=0.003 [--vocab-size 4096]
    python benchmarks/ablate_drafter.py --table        # the log as a Markdown table

Each variant appends one JSON line to --log (default benchmarks/ablation.jsonl): its settings,
held-out acc_k, chain acc, steps and wall time. Stores are {results}/store/{train,heldout}.
--table prints the log, each variant with the settings it changed from BASE_SETTINGS.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
import yaml
from common import default_target

# What every variant trains with unless --set changes it.
BASE_SETTINGS = {"epochs": 1, "batch_size": 8, "max_len": 512, "ttt_steps": 5, "lr": 0.003}
BASE_SETTINGS |= {"warmup_steps": 10, "checkpoint_every": 10**6, "num_workers": 1}


def parse_value(v: str):
    return yaml.safe_load(v)


def print_table(log: str) -> None:
    """The log's variants as a Markdown table: the settings each changed, held-out acc_k."""
    print("| variant | changed settings | steps | held-out acc_0..K | chain_acc_0..K | wall s |")
    print("|---|---|---|---|---|---|")
    for line in Path(log).read_text().splitlines():
        r = json.loads(line)
        diff = {k: v for k, v in r["settings"].items() if BASE_SETTINGS.get(k) != v}
        if r.get("vocab_size"):
            diff["draft_vocab.size"] = r["vocab_size"]
        acc = " / ".join(f"{100 * a:.1f}" for a in r["acc"])
        chain = " / ".join(f"{100 * a:.1f}" for a in r["chain_acc"])
        changed = ", ".join(f"{k}={v}" for k, v in diff.items()) or "(default)"
        print(f"| {r['name']} | {changed} | {r['steps']} | {acc} | {chain} | {r['wall_s']:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--name", help="the variant's name in the log (needed unless --table)")
    ap.add_argument("--table", action="store_true", help="print --log as a table and stop")
    ap.add_argument("--results", default="results")
    ap.add_argument("--target", default=default_target(), help="default: config.yaml's")
    ap.add_argument("--set", nargs="*", default=[], help="train settings, key=value (YAML)")
    ap.add_argument("--vocab-size", type=int, help="rebuild the draft vocabulary at this size")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log", default="benchmarks/ablation.jsonl")
    ap.add_argument("--accept-steps", type=int, help="also score K drafts like eyrie evaluate")
    ap.add_argument("--keep-drafter", help="copy the trained drafter folder here")
    args = ap.parse_args()
    if args.table:
        print_table(args.log)
        return
    if not args.name:
        ap.error("--name is needed to train a variant")
    torch.set_num_threads(args.threads)

    from eyrie.train import vocab as draft_vocab
    from eyrie.train.trainer import train

    r = Path(args.results)
    tr = sorted((r / "store" / "train").glob("shard-*.zarr"))
    he = sorted((r / "store" / "heldout").glob("shard-*.zarr"))
    settings = dict(BASE_SETTINGS)
    for kv in args.set:
        k, v = kv.split("=", 1)
        settings[k] = parse_value(v)
    with tempfile.TemporaryDirectory() as tmp:
        vocab = r / "draft_vocab" / "vocab.safetensors"
        if args.vocab_size:
            cfg = json.loads((Path(args.target) / "config.json").read_text())
            counts = draft_vocab.count_tokens(tr, int(cfg["vocab_size"]))
            vocab = Path(tmp) / "vocab.safetensors"
            draft_vocab.save(draft_vocab.build(counts, args.vocab_size), vocab, {})
        t0 = time.time()
        res = train(
            train_stores=tr,
            heldout_stores=he,
            target_dir=args.target,
            vocab_path=vocab,
            out_dir=Path(tmp) / "out",
            settings=settings,
            progress=False,
        )
        wall = time.time() - t0
        if args.accept_steps:  # the evaluate stage's metric on the same held-out rows
            from eyrie.evaluate.acceptance import evaluate_stores, load_drafter

            model, meta = load_drafter(Path(tmp) / "out" / "drafter")
            acc = evaluate_stores(
                model,
                meta["aux_layer_ids"],
                args.target,
                he,
                steps=args.accept_steps,
                max_len=int(settings["max_len"]),
            )
        if args.keep_drafter:
            shutil.rmtree(args.keep_drafter, ignore_errors=True)
            shutil.copytree(Path(tmp) / "out" / "drafter", args.keep_drafter)
        keep = Path("benchmarks/out/ablation")
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(tmp) / "out" / "metrics.csv", keep / f"{args.name}.metrics.csv")
    h = res["heldout"]
    rec = {
        "name": args.name,
        "settings": settings,
        "vocab_size": args.vocab_size,
        "steps": res["steps"],
        "wall_s": round(wall, 1),
        "acc": [round(a, 4) for a in h["acc"]],
        "chain_acc": [round(a, 4) for a in h["chain_acc"]],
        "loss": [round(a, 4) for a in h["loss"]],
    }
    if args.accept_steps:
        rec["acceptance"] = {k: acc.to_dict()[k] for k in ("acc", "chain", "tau_by_draft_tokens")}
    print(json.dumps(rec))
    with open(args.log, "a") as f:
        f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
