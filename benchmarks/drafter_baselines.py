"""The drafter's held-out acc_k next to baselines measured on the same scored positions.

    python benchmarks/drafter_baselines.py --results results
    python benchmarks/drafter_baselines.py --train-stores A.zarr B.zarr --heldout-stores C.zarr \
        --target models/toy-llama --drafter-json results/evaluate/acceptance.json

Baselines (eyrie/evaluate/baselines.py): the bigram table x_{t+1} -> most frequent greedy[t+1]
(fit on the train stores) and the per-position 2-layer MLP probe on the drafter's own step-0 inputs
[aux_t, embed(x_{t+1})], and with final_t too; every one scored on the held-out rows acc_0 is
scored on (loss-mask token at t+2, target = the target's greedy token at t+1, full vocabulary).
The drafter's numbers are read from the run's evaluate (acceptance.json) and train
(heldout.json) outputs; the scored row counts are printed side by side as a check.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from common import default_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default="results", help="a run's results folder")
    ap.add_argument("--train-stores", nargs="+", help="default: {results}/store/train/*.zarr")
    ap.add_argument("--heldout-stores", nargs="+", help="default: {results}/store/heldout/*")
    ap.add_argument("--target", default=default_target(), help="default: config.yaml's")
    ap.add_argument("--max-len", type=int, default=512, help="train.max_len of the run")
    ap.add_argument("--drafter-json", nargs="*", help="acceptance.json / heldout.json to show")
    ap.add_argument("--probe-epochs", type=int, default=3)
    ap.add_argument("--probe-width", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from eyrie.evaluate.baselines import measure

    r = Path(args.results)
    train = args.train_stores or sorted((r / "store" / "train").glob("shard-*.zarr"))
    held = args.heldout_stores or sorted((r / "store" / "heldout").glob("shard-*.zarr"))
    t0 = time.time()
    rec = measure(
        train,
        held,
        args.target,
        args.max_len,
        probe_epochs=args.probe_epochs,
        probe_width=args.probe_width,
    )
    rec["wall_s"] = time.time() - t0

    drafters = args.drafter_json
    if drafters is None:
        drafters = [r / "evaluate" / "acceptance.json", r / "train" / "heldout.json"]
    rows = [
        ("bigram x_{t+1} -> greedy[t+1] (train table)", rec["bigram_acc"], rec["scored_heldout"]),
        (f"probe MLP [aux_t, embed(x_t+1)], {args.probe_epochs} ep", rec["probe"]["acc"], None),
        ("probe MLP [aux_t, final_t, embed(x_t+1)]", rec["probe_with_final"]["acc"], None),
    ]
    for p in map(Path, drafters):
        if p.is_file():
            d = json.loads(p.read_text())
            accs = " ".join(f"{a:.3f}" for a in d["acc"])
            rows.append((f"drafter acc_0 ({p}); acc_0..: {accs}", d["acc"][0], d["scored"][0]))
    print(
        f"held-out step-0 rows scored: {rec['scored_heldout']} (train rows {rec['scored_train']})"
    )
    print(f"{'predictor of greedy[t+1]':<72} {'acc':>6} {'scored':>7}")
    for name, acc, n in rows:
        print(f"{name:<72} {100 * acc:5.1f}% {'' if n is None else n:>7}")
    print(f"baselines took {rec['wall_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
