"""On a GPU: the drafter's fused unroll attention against the joint softmax written out in fp64
on the CPU (values and gradients, bf16 and fp32 on CUDA), then Eyrie's training step at the 8B
shape (bench_train.py --size realistic).

    PYTHONPATH=. python3 benchmarks/gpu_check_attention.py   # checkout root, torch with CUDA

Prints, per case, the largest error over the largest |value| of the output and of the
gradients of q and of every cached k and v. tests/test_drafter.py checks the same on the CPU.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from eyrie.train.model import unroll_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_drafter import joint_softmax_attention as joint_softmax  # noqa: E402  the reference


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double().cpu() - b).abs().max() / b.abs().max()).item()


def check(hd: int, steps: int, dtype: torch.dtype) -> str:
    g = torch.Generator().manual_seed(hd + steps)
    shape = (2, 8, 300, hd)
    exact = [torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(1 + 2 * steps)]
    grad = torch.randn(*shape, generator=g, dtype=torch.float64)
    gpu = [x.to("cuda", dtype).requires_grad_(True) for x in exact]
    ref = [x.to(dtype).double().requires_grad_(True) for x in exact]  # the same rounded inputs

    def pairs(xs):
        return [(xs[1 + 2 * i], xs[2 + 2 * i]) for i in range(steps)]

    out = unroll_attention(gpu[0], pairs(gpu))
    want = joint_softmax(ref[0], pairs(ref))
    got_grads = torch.autograd.grad(out, gpu, grad.to("cuda", dtype))
    want_grads = torch.autograd.grad(want, ref, grad)
    grads = max(relative(a, b) for a, b in zip(got_grads, want_grads, strict=True))
    err = relative(out, want)
    return f"hd {hd} steps {steps} {dtype}: rel err out {err:.2e}, grads {grads:.2e}"


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device; this check is for a GPU machine")
    for hd, steps in ((64, 1), (64, 4), (128, 7)):
        for dtype in (torch.bfloat16, torch.float32):
            print(check(hd, steps, dtype), flush=True)
    bench = [sys.executable, "benchmarks/bench_train.py", "--size", "realistic", "--device", "cuda"]
    subprocess.run(bench + ["--batch-size", "2", "--len", "2048", "--steps", "5"], check=False)


if __name__ == "__main__":
    main()
