"""Print benchmarks/ablation.jsonl (written by ablate_drafter.py) as a Markdown table."""

import json
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/ablation.jsonl"
print("| variant | changed settings | steps | held-out acc_0..K | chain_acc_0..K | wall s |")
print("|---|---|---|---|---|---|")
base = {"epochs": 1, "batch_size": 8, "max_len": 512, "ttt_steps": 5, "lr": 0.003}
base |= {"warmup_steps": 10, "checkpoint_every": 10**6, "num_workers": 1}
for line in open(path):
    r = json.loads(line)
    diff = {k: v for k, v in r["settings"].items() if base.get(k) != v}
    if r.get("vocab_size"):
        diff["draft_vocab.size"] = r["vocab_size"]
    acc = " / ".join(f"{100 * a:.1f}" for a in r["acc"])
    chain = " / ".join(f"{100 * a:.1f}" for a in r["chain_acc"])
    changed = ", ".join(f"{k}={v}" for k, v in diff.items()) or "(default)"
    print(f"| {r['name']} | {changed} | {r['steps']} | {acc} | {chain} | {r['wall_s']:.0f} |")
