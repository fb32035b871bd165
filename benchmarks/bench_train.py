"""Drafter training throughput: tokens/s and model FLOP utilization (MFU).

One optimizer step (targets from the frozen lm_head, the unrolled drafter forward, the soft CE,
backward, AdamW) on random data, timed after warm-up. MFU is the drafter's analytical FLOPs per
second over a peak measured in the same run: a large plain matmul in the same dtype (and, on
GPU, also over the device's datasheet peak when it is known). Random data gives the same FLOPs
as real data; only the accuracy numbers would differ.

    python benchmarks/bench_train.py                 # the toy drafter on CPU (and GPU if any)
    python benchmarks/bench_train.py --steps 7 --threads 2
    python benchmarks/bench_train.py --size mid --device cpu --batch-size 2 --len 512

Sizes: "toy" is the drafter of models/toy-llama (H 256, 8 heads / 2 KV heads of 32, MLP 704,
draft vocab 1024 of 4096); "realistic" is a Llama-3-8B-sized drafter (H 4096, 32 / 8 heads of
128, MLP 14336, draft vocab 32000 of 128256), run by default only where CUDA is present;
"mid" keeps realistic's proportions at a quarter of its width (H 1024, 8 / 2 heads of 128, MLP
3584, draft vocab 8000 of 32064), small enough to set beside a peer's loop on a CPU.
With --size, one case runs on --device (fp32 on the CPU, bf16 autocast on a GPU).
"""

from __future__ import annotations

import argparse
import time

import torch
from common import host_line, machine, print_profile

from eyrie.train.loss import forward_batch, step_counts, weighted_loss
from eyrie.train.model import Drafter, DrafterConfig, TargetHead

SIZES = {
    "toy": dict(
        hidden_size=256,
        intermediate_size=704,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=4096,
        draft_vocab_size=1024,
    ),
    "mid": dict(
        hidden_size=1024,
        intermediate_size=3584,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        vocab_size=32064,
        draft_vocab_size=8000,
    ),
    "realistic": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        draft_vocab_size=32000,
    ),
}
# dense bf16 tensor-core peaks (datasheet, no sparsity), FLOP/s
GPU_PEAKS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}


def flops_per_token(c: DrafterConfig, T: int, K: int) -> float:
    """Training FLOPs per token of one optimizer step: 3x the unrolled forward (forward +
    backward), plus the frozen target head (forward only)."""
    H, inter, nh, nkv, hd = (
        c.hidden_size,
        c.intermediate_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
    )
    step = 2 * (2 * H * (nh + 2 * nkv) * hd + nh * hd * H + 3 * H * inter + H * c.draft_vocab_size)
    fc = 2 * c.num_aux * H * H
    attention = sum(4 * nh * hd * ((T + 1) / 2 + k) for k in range(K))  # QK^T and PV
    target = 2 * H * (c.vocab_size + c.draft_vocab_size)
    return 3 * (K * step + fc + attention) + target


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device, dtype, n: int, repeats: int) -> float:
    """FLOP/s of a plain n x n matmul: the attainable peak on this machine, measured now."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    sync(device)
    t = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync(device)
    return 2 * n**3 * repeats / (time.perf_counter() - t)


def bench(
    size: str, device, B: int, T: int, K: int, steps: int, autocast, profile: int = 0
) -> dict:
    c = DrafterConfig(num_aux=3, **SIZES[size])
    torch.manual_seed(0)
    model = Drafter(c).to(device)
    tokens = torch.sort(torch.randperm(c.vocab_size)[: c.draft_vocab_size]).values
    model.set_vocab(
        tokens - torch.arange(len(tokens)),
        torch.zeros(c.vocab_size, dtype=torch.bool).index_fill(0, tokens, True),
    )
    head_dtype = autocast or torch.float32
    head = TargetHead(
        0.02 * torch.randn(c.vocab_size, c.hidden_size, device=device, dtype=head_dtype),
        0.02 * torch.randn(c.vocab_size, c.hidden_size, device=device, dtype=head_dtype),
        tokens.to(device),
    )
    act = autocast or torch.float32
    batch = {
        "input_ids": torch.randint(0, c.vocab_size, (B, T), device=device),
        "loss_mask": torch.ones(B, T, dtype=torch.bool, device=device),
        "aux_hidden": torch.randn(B, T, 3, c.hidden_size, device=device, dtype=act),
        "final_hidden": torch.randn(B, T, c.hidden_size, device=device, dtype=act),
    }
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def one_step():
        terms = forward_batch(model, head, batch, K, autocast, model.d2t)
        loss = weighted_loss(terms["ce"], step_counts(batch["loss_mask"], K), 0.8, 1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()

    one_step()  # warm-up (allocations, kernel selection)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t = time.perf_counter()
    for _ in range(steps):
        one_step()
    sync(device)
    seconds = (time.perf_counter() - t) / steps
    tok_s = B * T / seconds
    if profile:  # after the timing, so that the profiler's own cost is not in it
        print_profile(one_step, device, calls=2, rows=profile)
    return {
        "size": size,
        "B": B,
        "T": T,
        "K": K,
        "step_s": seconds,
        "tokens_per_s": tok_s,
        "flop_s": tok_s * flops_per_token(c, T, K),
        # the model, its optimizer state and one step's activations: the peak of a timed step
        "peak_memory": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
    }


def report(r: dict, peak: float, label: str, extra: str = "") -> None:
    print(
        f"{r['size']:>9} B={r['B']} T={r['T']} K={r['K']}: {r['step_s'] * 1e3:8.1f} ms/step, "
        f"{r['tokens_per_s']:10.0f} tokens/s, {r['flop_s'] / 1e9:9.1f} GFLOP/s, "
        f"MFU {r['flop_s'] / peak:.1%} of the {label} ({peak / 1e9:.0f} GFLOP/s){extra}"
        + (f", peak memory {r['peak_memory'] / 2**30:.1f} GiB" if r["peak_memory"] else "")
    )


def one_case(args) -> None:
    device = torch.device(args.device)
    if device.type == "cuda":
        peak, label, autocast = (
            matmul_peak(device, torch.bfloat16, 8192, 20),
            "bf16 matmul",
            torch.bfloat16,
        )
    else:
        peak, label, autocast = matmul_peak(device, torch.float32, 1024, 10), "fp32 matmul", None
    r = bench(
        args.size,
        device,
        args.batch_size,
        args.len,
        args.ttt_steps,
        args.steps,
        autocast,
        args.profile,
    )
    report(r, peak, label)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps per case")
    p.add_argument("--ttt-steps", type=int, default=7, help="unroll steps K")
    p.add_argument("--no-gpu", action="store_true")
    p.add_argument("--size", choices=sorted(SIZES), help="one case only, on --device")
    p.add_argument("--device", default="cpu", help="with --size")
    p.add_argument("--batch-size", type=int, default=2, help="with --size")
    p.add_argument("--len", type=int, default=2048, help="with --size: tokens per sample")
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="ROWS",
        help="with --size: after the timing, the top ROWS ops of two profiled steps",
    )
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(machine("cuda" if torch.cuda.is_available() else "cpu"))
    print(host_line())
    if args.size:
        one_case(args)
        return
    cpu = torch.device("cpu")
    peak = matmul_peak(cpu, torch.float32, 1024, 10)
    print(f"baseline: fp32 1024^3 matmul on CPU, measured now: {peak / 1e9:.1f} GFLOP/s")
    # the toy's mean sample is ~120 tokens; length bucketing keeps batches near that
    for K in (1, args.ttt_steps):
        report(bench("toy", cpu, 16, 128, K, args.steps, None), peak, "fp32 matmul")
    if torch.cuda.is_available() and not args.no_gpu:
        gpu = torch.device("cuda")
        gpeak = matmul_peak(gpu, torch.bfloat16, 8192, 20)
        name = torch.cuda.get_device_name()
        sheet = next((v for k, v in GPU_PEAKS.items() if k in name), None)
        print(f"baseline: bf16 8192^3 matmul on {name}: {gpeak / 1e12:.0f} TFLOP/s")
        r = bench("realistic", gpu, 2, 2048, args.ttt_steps, args.steps, torch.bfloat16)
        extra = f"; {r['flop_s'] / sheet:.1%} of the datasheet peak" if sheet else ""
        report(r, gpeak, "bf16 matmul", extra)
        r = bench("toy", gpu, 16, 512, args.ttt_steps, args.steps, torch.bfloat16)
        report(r, gpeak, "bf16 matmul")
    else:
        print("no CUDA device: the realistic (H = 4096) case is skipped")


if __name__ == "__main__":
    main()
