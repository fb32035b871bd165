"""Can the drafter learn to copy? A synthetic check of its attention over the context.

A target that repeats itself hands a context lookup most of its tokens (SmolLM2's MT-bench
answers: 76 % of held-out rows, RESULTS.md), and the drafter's one attention layer over the
context can learn the same: find the earlier occurrence of the token it is fed and name the
token that followed. Here the data are random phrases of ``P`` tokens said three times over;
the target's aux states name only the current token and its greedy token is the next one.
The drafter trains through Eyrie's own unroll loss (eyrie.train.loss) and is scored at step 0
on fresh phrases: on the first saying nothing can be right but chance (1/V); on the repeats
only attention over the context can be right.

    python benchmarks/copy_task.py --steps 600 --every 100 [--attn-init default]

prints step-0 accuracy on the first saying and on the repeats every ``--every`` steps, and the
machine. A mask that hid the context keeps the repeats at chance; tokens fed one position off
make the first saying right too (tests/test_drafter_quality.py runs both checks' positive side).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eyrie.train.loss import forward_batch, step_counts, weighted_loss  # noqa: E402
from eyrie.train.model import Drafter, DrafterConfig, TargetHead  # noqa: E402


def copy_task(seed=0, V=128, H=32, P=12, heads=2, steps=600, every=0, attn_init="self", lr=3e-3):
    """[(step, first-saying accuracy, repeats accuracy)] at every ``every`` steps and the end."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    T = 3 * P
    E = torch.randn(V, H, generator=g)
    head = TargetHead(E, E, torch.arange(V))

    def batch(n):
        ids = torch.randint(0, V, (n, P), generator=g).repeat(1, 3)
        return dict(
            input_ids=ids,
            aux_hidden=E[ids].unsqueeze(2).expand(n, T, 3, H),  # low layers: the token itself
            final_hidden=4 * E[torch.roll(ids, -1, 1)],  # the target names the next token
            loss_mask=torch.ones(n, T, dtype=torch.bool),
        )

    cfg = DrafterConfig(H, 2 * H, heads, heads, H // heads, num_aux=3, vocab_size=V,
                        draft_vocab_size=V)  # fmt: skip
    model = Drafter(cfg)
    model.set_vocab(torch.zeros(V, dtype=torch.long), torch.ones(V, dtype=torch.bool))
    model.init_head_from_target(E, None)
    if attn_init == "self":  # train.attn_init: self, the shipped config.yaml's
        model.init_attention_to_self()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    test = batch(64)

    def score(step):
        with torch.no_grad():
            logits = model(test["aux_hidden"], test["input_ids"], head.embed, 1)[0]
        hit = (logits.argmax(-1)[:, : T - 2] == test["input_ids"][:, 2:]).float()
        return step, hit[:, : P - 2].mean().item(), hit[:, P:].mean().item()

    curve = []
    for step in range(steps):
        if every and step % every == 0:
            curve.append(score(step))
        b = batch(16)
        terms = forward_batch(model, head, b, 2, None, model.d2t)
        loss = weighted_loss(terms["ce"], step_counts(b["loss_mask"], 2), 0.8, 1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return curve + [score(steps)]


def main(argv: list[str] | None = None) -> int:
    from eyrie.common.provenance import machine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--phrase", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--attn-init", choices=("self", "default"), default="self")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = ap.parse_args(argv)
    print(json.dumps(machine()))
    for seed in args.seeds:
        t0 = time.perf_counter()
        curve = copy_task(seed, args.vocab, args.hidden, args.phrase, args.heads, args.steps,
                          args.every, args.attn_init)  # fmt: skip
        print(f"seed {seed}, attn_init {args.attn_init}, chance {1 / args.vocab:.3f} "
              f"({time.perf_counter() - t0:.0f} s):")  # fmt: skip
        for step, first, repeats in curve:
            print(f"  step {step:5d}: first saying {first:.3f}, repeats {repeats:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
