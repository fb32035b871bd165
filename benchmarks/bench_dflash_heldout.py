"""DFlash's held-out scoring and offline drafts: the batch's shared inputs computed once, against
recomputing them for every chunk of anchors; and the blocks' head as one matmul against a batched
matmul per block, in a training step. Same run, same inputs.

Held-out scoring runs every anchor of a batch, `anchors` at a time. Each chunk needs the
target's greedy tokens (a full-vocabulary head over every row of the batch) and the drafter's
context keys; both are the same for every chunk. The offline drafts (evaluate) need only the
first `steps` slots of each block through the head. Both ways give the same sums and drafts.
The head over a strided slice of the block outputs (slots 1..B-1) runs in F.linear as a batched
matmul of B-1 rows per block; draft_logits reshapes the slice to rows first.

    python benchmarks/bench_dflash_heldout.py                    # SmolLM2's shape, CPU
    python benchmarks/bench_dflash_heldout.py --len 1024 --device cuda
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch
from common import host_line, versions_line

import eyrie.train.dflash_loss as dflash_loss
from eyrie.evaluate.acceptance import block_drafts
from eyrie.train.dflash import DFlashConfig, DFlashDrafter, draft_logits
from eyrie.train.dflash_loss import block_terms, eligible, every_anchor, sample_anchors
from eyrie.train.method import heldout_terms

SHAPES = {  # (hidden, intermediate, heads, kv heads, vocab): SmolLM2-135M-Instruct, the toy
    "smollm2": (576, 1536, 9, 3, 49152),
    "toy": (128, 384, 4, 2, 4096),
}


def setup(args, device):
    H, inter, nh, nkv, V = SHAPES[args.shape]
    cfg = DFlashConfig(
        hidden_size=H,
        intermediate_size=inter,
        num_attention_heads=nh,
        num_key_value_heads=nkv,
        head_dim=H // nh,
        num_hidden_layers=args.layers,
        num_aux=3,
        vocab_size=V,
        block_size=args.block,
        mask_token_id=0,
    )
    torch.manual_seed(0)
    model = DFlashDrafter(cfg).to(device).eval()
    embed_w = torch.randn(V, H, device=device) * 0.02
    head = SimpleNamespace(
        lm_head=torch.randn(V, H, device=device) * 0.02, embed=lambda x: embed_w[x]
    )
    T, b = args.len, args.batch
    batch = {
        "aux_hidden": torch.randn(b, T, 3, H, device=device),
        "input_ids": torch.randint(0, V, (b, T), device=device),
        "final_hidden": torch.randn(b, T, H, device=device),
        "loss_mask": torch.ones(b, T, dtype=torch.long, device=device),
    }
    return model, head, batch


def timed(fn, share: bool, device) -> tuple:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn(share)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def heldout(model, head, batch, n: int, share: bool) -> dict:
    """eyrie's held-out terms, or the former way: each chunk of anchors on its own."""
    if share:
        return heldout_terms(
            model, head, batch, {"method": "dflash", "dflash": {"anchors": n}}, None
        )
    anchors = every_anchor(eligible(batch["loss_mask"]))
    chunks = [
        block_terms(model, head, batch, anchors[:, s : s + n], None)
        for s in range(0, anchors.shape[1], n)
    ]
    return {k: sum(c[k] for c in chunks) for k in chunks[0] if k != "accepted"}


def drafts(model, head, batch, steps: int, chunk: int, share: bool) -> torch.Tensor:
    """evaluate's block_drafts (steps, b, T), or the former way: the context rebuilt for each
    chunk of rows and every slot of a block through the head."""
    aux, ids = batch["aux_hidden"], batch["input_ids"]
    if share:
        return torch.stack(block_drafts(model, aux, ids, head.embed, head.lm_head, steps, chunk))
    T = ids.shape[1]
    after = torch.arange(1, T + 1, device=ids.device)  # row t's block: anchored at t + 1
    anchors = after.masked_fill(after >= T, -1).expand(ids.shape[0], T)
    out = []
    for s in range(0, T, chunk):
        h = model(aux, ids, anchors[:, s : s + chunk], head.embed)
        out.append(draft_logits(h, head.lm_head)[..., :steps, :].argmax(-1))
    return torch.cat(out, 1).permute(2, 0, 1)


def strided_head(hidden, lm_head):
    """draft_logits as it was: F.linear on the strided slice itself."""
    return torch.nn.functional.linear(hidden[..., 1:, :], lm_head.to(hidden.dtype))


def train_step(model, head, batch, anchors, one_matmul: bool) -> torch.Tensor:
    """One forward and backward of the block loss: the gradients of the drafter's first layer."""
    if not one_matmul:
        dflash_loss.draft_logits = strided_head
    try:
        model.zero_grad(set_to_none=True)
        block_terms(model, head, batch, anchors, None)["ce"].sum().backward()
    finally:
        dflash_loss.draft_logits = draft_logits
    return model.fc.weight.grad.clone()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    ap.add_argument("--len", type=int, default=512, help="tokens per sample")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--anchors", type=int, default=64, help="train.dflash.anchors: a chunk")
    ap.add_argument("--steps", type=int, default=7, help="evaluate.steps: slots scored offline")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    model, head, batch = setup(args, device)
    print(host_line(torch.cuda.get_device_name() if device.type == "cuda" else None))
    print(versions_line())
    print(
        f"shape {args.shape}, {args.layers} layers, block {args.block}, batch {args.batch} x "
        f"{args.len} tokens, anchors {args.anchors} a chunk, evaluate.steps {args.steps}, fp32"
    )
    with torch.no_grad():
        for name, run in (
            ("held-out terms", lambda share: heldout(model, head, batch, args.anchors, share)),
            ("offline drafts", lambda share: drafts(model, head, batch, args.steps, 64, share)),
        ):
            times = {False: [], True: []}
            outs = {}
            for _ in range(args.repeats):  # interleaved: both ways see the same host load
                for share in (False, True):
                    seconds, outs[share] = timed(run, share, device)
                    times[share].append(seconds)
            if isinstance(outs[True], dict):
                same = all(torch.allclose(outs[True][k], outs[False][k]) for k in outs[True])
            else:
                same = torch.equal(outs[True], outs[False])
            before, after = min(times[False]), min(times[True])
            print(
                f"{name}: recomputed per chunk {before:.2f} s, shared {after:.2f} s "
                f"(best of {args.repeats}): {before / after:.2f}x; same result: {same}"
            )
    anchors = sample_anchors(eligible(batch["loss_mask"]), args.anchors, torch.Generator())
    times, grads = {False: [], True: []}, {}
    for _ in range(args.repeats):
        for one in (False, True):
            seconds, grads[one] = timed(
                lambda one: train_step(model, head, batch, anchors, one), one, device
            )
            times[one].append(seconds)
    before, after = min(times[False]), min(times[True])
    same = torch.allclose(grads[False], grads[True], rtol=1e-4, atol=1e-7)
    print(
        f"training step (forward and backward, {args.anchors} anchors): head as a batched "
        f"matmul per block {before:.2f} s, as one matmul {after:.2f} s: {before / after:.2f}x; "
        f"same gradients: {same}"
    )


if __name__ == "__main__":
    main()
