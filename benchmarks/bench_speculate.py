"""Speculative decoding against plain greedy decoding of the same prompts (same run, batch 1).

Both use eyrie.evaluate.speculate's one KV-cache code path (transformers DynamicCache; the target
runs once per token in plain decoding, once per verify step in speculation), timed as the
evaluate_speculate rule times them (eyrie.evaluate.compare): after a warm-up, plain and
speculative runs interleave prompt by prompt, the order within a pair flipping between
``--repeats`` passes; tokens/s count new tokens over wall-clock time, prefill included.
Prints the machine, both tokens/s, the median ratio over the repeats and its spread, the mean
accept length (tokens per verify step, bonus included) and whether every output equalled plain
greedy decoding. On a shared machine the spread shows how steady the ratio is.

    python benchmarks/bench_speculate.py                               # toy-llama, CPU
    python benchmarks/bench_speculate.py --device cuda --draft-tokens 1 2 3 4 5
    python benchmarks/bench_speculate.py --untrained                   # a random drafter
    python benchmarks/bench_speculate.py --target models/toy-llama-deep --shapes 3-4-8   # trees

The drafter defaults to results/train/drafter (the default workflow's); ``--untrained`` uses a
random one instead, which shows what rejected drafts cost.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from common import ROOT

from eyrie.common.device import pick_device
from eyrie.common.provenance import machine
from eyrie.evaluate.compare import compare
from eyrie.evaluate.draft_runner import DraftRunner
from eyrie.evaluate.loading import DTYPES, eos_ids, load_pair, load_prompts
from eyrie.evaluate.target_runner import Target


def untrained_pair(target_dir: Path, device, dtype: str, aux: list[int]):
    from eyrie.target.load import load_model, load_tokenizer
    from eyrie.train.model import Drafter, DrafterConfig

    model, _ = load_model(target_dir, device)
    model = model.to(device, DTYPES[dtype])
    cfg = json.loads((target_dir / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    torch.manual_seed(0)
    n = min(1024, int(text["vocab_size"]))
    drafter = Drafter(DrafterConfig.from_target(cfg, num_aux=len(aux), draft_vocab_size=n))
    t2d = torch.zeros(int(text["vocab_size"]), dtype=torch.bool)
    t2d[:n] = True
    drafter.set_vocab(torch.zeros(n, dtype=torch.long), t2d)
    drafter = drafter.to(device, DTYPES[dtype]).eval()
    target = Target(model, aux)
    return target, DraftRunner(drafter, target.embed), load_tokenizer(target_dir)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(ROOT / "models" / "toy-llama"))
    ap.add_argument("--drafter", default=str(ROOT / "results" / "train" / "drafter"))
    ap.add_argument("--untrained", action="store_true", help="a random drafter instead")
    ap.add_argument("--prompts-jsonl", default=str(ROOT / "data" / "chat" / "heldout.jsonl"))
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--draft-tokens", type=int, nargs="+", default=[3])
    ap.add_argument(
        "--shapes",
        nargs="+",
        default=[],
        help="also trees, as STEPS-TOPK-VERIFIED (e.g. 3-4-8 2-4-6); STEPS-1-(STEPS+1) a chain",
    )
    ap.add_argument("--repeats", type=int, default=3, help="interleaved timing passes")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--threads", type=int, help="CPU threads for torch")
    ap.add_argument("--json", help="also write every result here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    device = pick_device(args.device, "--device")
    target_dir = Path(args.target)
    if args.untrained:
        target, runner, tok = untrained_pair(target_dir, device, args.dtype, [1, 3, 4])
        drafter = "untrained (random weights)"
    else:
        if not (Path(args.drafter) / "drafter.json").is_file():
            sys.exit(
                f"no trained drafter in {args.drafter}: run the workflow (snakemake --cores 2), "
                "pass --drafter, or use --untrained"
            )
        target, runner, tok, _ = load_pair(target_dir, args.drafter, device, args.dtype)
        drafter = args.drafter
    prompts = load_prompts(args.prompts_jsonl, tok, args.prompts)
    eos = eos_ids(tok, target.model.config)
    m = machine()
    print(
        f"machine: CPU {m['cpu']} ({m['cpu_cores']} cores, torch threads {m['torch_threads']}) "
        f"| GPU {m['gpu'] or 'none'} | torch {m['torch']} | transformers {m.get('transformers')}"
    )
    print(
        f"target {target_dir} on {device} ({args.dtype}); drafter {drafter}; "
        f"{len(prompts)} prompts, {args.max_new_tokens} new tokens each, batch 1, greedy"
    )
    results = []
    shapes = [(k, 1, k + 1) for k in args.draft_tokens]
    shapes += [tuple(int(x) for x in s.split("-")) for s in args.shapes]
    for k, topk, verify in shapes:
        r = compare(target, runner, prompts, k=k, max_new_tokens=args.max_new_tokens, eos=eos,
                    repeats=args.repeats, topk=topk, verify_tokens=verify,
                    tokenizer=tok)  # fmt: skip
        r.pop("rows")
        results.append(r)
        print(
            f"{k}-{topk}-{verify}: plain {r['plain_tokens_per_s']:.1f} tok/s | speculative "
            f"{r['spec_tokens_per_s']:.1f} tok/s | ratio {r['speedup']:.2f}x (median of "
            f"{r['repeats']}, {r['speedup_min']:.2f}-{r['speedup_max']:.2f}x) | mean accept "
            f"length {r['accept_length']:.2f} (drafts accepted {r['accepted_drafts_mean']:.2f} "
            f"of {k}) | identical to greedy {r['identical']}/{r['prompts']}"
        )
    target.close()
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": m, "results": results}, indent=1))
    return 0 if all(r["identical"] == r["prompts"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
