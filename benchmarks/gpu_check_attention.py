"""On a GPU: the drafter's fused unroll attention against the joint softmax written out in fp64
on the CPU (values and gradients, bf16 and fp32 on CUDA), then Eyrie's training step at the 8B
shape (bench_train.py --size realistic).

    PYTHONPATH=. python3 benchmarks/gpu_check_attention.py   # checkout root, torch with CUDA
    python benchmarks/gpu_check_attention.py --device cpu --size toy   # CI's CPU rehearsal

Prints, per case, the largest error over the largest |value| of the output and of the
gradients of q and of every cached k and v. tests/test_drafter.py checks the same on the CPU.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch

from eyrie.train.model import unroll_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_drafter import joint_softmax_attention as joint_softmax  # noqa: E402  the reference

# a few rounding steps of the dtype over the largest value (fp32 in practice ~1e-6)
TOLERANCE = {torch.bfloat16: 3e-2, torch.float32: 1e-4}


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double().cpu() - b).abs().max() / b.abs().max()).item()


def check(hd: int, steps: int, dtype: torch.dtype, device: str) -> str:
    g = torch.Generator().manual_seed(hd + steps)
    shape = (2, 8, 300, hd)
    exact = [torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(1 + 2 * steps)]
    grad = torch.randn(*shape, generator=g, dtype=torch.float64)
    gpu = [x.to(device, dtype).requires_grad_(True) for x in exact]
    ref = [x.to(dtype).double().requires_grad_(True) for x in exact]  # the same rounded inputs

    def pairs(xs):
        return [(xs[1 + 2 * i], xs[2 + 2 * i]) for i in range(steps)]

    out = unroll_attention(gpu[0], pairs(gpu))
    want = joint_softmax(ref[0], pairs(ref))
    got_grads = torch.autograd.grad(out, gpu, grad.to(device, dtype))
    want_grads = torch.autograd.grad(want, ref, grad)
    grads = max(relative(a, b) for a, b in zip(got_grads, want_grads, strict=True))
    err = relative(out, want)
    line = f"hd {hd} steps {steps} {dtype}: rel err out {err:.2e}, grads {grads:.2e}"
    if max(err, grads) > TOLERANCE[dtype]:
        sys.exit(f"error: {line}, above {TOLERANCE[dtype]:g}: the fused attention is wrong here")
    return line


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a rehearsal")
    p.add_argument("--size", default="realistic", help="bench_train.py's drafter shape")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no CUDA device; on a CPU rehearse with --device cpu --size toy")
    for hd, steps in ((64, 1), (64, 4), (128, 7)):
        for dtype in (torch.bfloat16, torch.float32):
            print(check(hd, steps, dtype, args.device), flush=True)
    length, steps = ("2048", "5") if args.device == "cuda" else ("64", "1")  # a CPU rehearses
    bench = [sys.executable, "benchmarks/bench_train.py", "--size", args.size, "--device"]
    bench += [args.device, "--batch-size", "2", "--len", length, "--steps", steps]
    sys.exit(subprocess.run(bench, check=False).returncode)


if __name__ == "__main__":
    main()
