"""SpecForge's own training loop at one of bench_train.py's drafter shapes, on random features:
tokens/s, MFU and peak memory, to set beside bench_train.py's figures for Eyrie's loop.

    python benchmarks/peer_specforge_throughput.py synth --size realistic --out /tmp/sf-8b
    /tmp/sf-venv/bin/python benchmarks/peer_specforge.py train --data /tmp/sf-8b --device cuda \
        --epochs 1 --batch-size 2 --ttt 7 --max-len 2048 --log-interval 5 | tee /tmp/sf-8b/train.log
    python benchmarks/peer_specforge_throughput.py summarize --size realistic \
        --log /tmp/sf-8b/train.log --len 2048 --batch-size 2 --ttt 7

``synth`` writes what ``peer_specforge.py convert`` writes for a real run, at the shape of
``bench_train.SIZES[size]`` ("realistic" is a Llama-3-8B-sized drafter: H 4096, 32 / 8 heads,
MLP 14336, draft vocabulary 32000 of 128256): random feature files of ``--len`` tokens, a
target folder with a random embedding and lm_head (and the toy's tokenizer, which SpecForge
loads although offline training reads no text), and the drafter's LlamaForCausalLMEagle3
config. Random data costs the same FLOPs as real data.

bench_train.py times Eyrie's step at that shape with B 2, T 2048, K 7, as the commands above
do. ``summarize`` reads SpecForge's logged ``perf/optimizer_step_time_s`` (the median over the
logged steps after the first) and the peak memory ``peer_specforge.py train`` prints at exit;
MFU uses bench_train.py's FLOPs per token over the device's datasheet peak (``--peak``, or
bench_train's table for the GPU's name).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
from pathlib import Path

import torch
from bench_train import GPU_PEAKS, SIZES, flops_per_token

from eyrie.train.model import DrafterConfig


def synth(args) -> None:
    from safetensors.torch import save_file

    shape = SIZES[args.size]
    H, V = shape["hidden_size"], shape["vocab_size"]
    out = Path(args.out)
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", args.samples), ("heldout", 2)):
        folder = out / split
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for i in range(n):
            sample = {
                "input_ids": torch.randint(0, V, (args.len,), generator=g),
                "loss_mask": torch.ones(args.len, dtype=torch.long),
                "hidden_state": torch.randn(1, args.len, H, generator=g).bfloat16(),
                "aux_hidden_state": torch.randn(1, args.len, 3 * H, generator=g).to(dtype),
            }
            torch.save(sample, folder / f"data_{i:08d}.ckpt")
    target = out / "target"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(
        Path(args.tokenizer_from), target, ignore=shutil.ignore_patterns("*.safetensors")
    )
    config = json.loads((target / "config.json").read_text())
    config.update(
        hidden_size=H,
        intermediate_size=shape["intermediate_size"],
        num_attention_heads=shape["num_attention_heads"],
        num_key_value_heads=shape["num_key_value_heads"],
        head_dim=shape["head_dim"],
        vocab_size=V,
        num_hidden_layers=32,
    )
    (target / "config.json").write_text(json.dumps(config, indent=2))
    weights = {
        "model.embed_tokens.weight": (0.02 * torch.randn(V, H, generator=g)).bfloat16(),
        "lm_head.weight": (0.02 * torch.randn(V, H, generator=g)).bfloat16(),
    }
    save_file(weights, str(target / "model.safetensors"))
    index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in weights}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    draft = {
        **config,
        "architectures": ["LlamaForCausalLMEagle3"],
        "num_hidden_layers": 1,
        "draft_vocab_size": shape["draft_vocab_size"],
        "target_hidden_size": H,
        "tie_word_embeddings": False,
    }
    (out / "draft.json").write_text(json.dumps(draft, indent=2))
    print(
        json.dumps(
            {"size": args.size, "samples": args.samples, "tokens": args.len, "out": str(out)}
        )
    )


def summarize(args) -> None:
    text = Path(args.log).read_text()
    steps = [float(x) for x in re.findall(r"'perf/optimizer_step_time_s': ([0-9.e-]+)", text)]
    if len(steps) < 2:
        raise SystemExit(f"{args.log}: fewer than 2 logged step times; log more often")
    step_s = statistics.median(steps[1:])
    tok_s = args.batch_size * args.len / step_s
    cfg = DrafterConfig(num_aux=3, **SIZES[args.size])
    flop_s = tok_s * flops_per_token(cfg, args.len, args.ttt)
    peak = args.peak
    if peak is None and torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in GPU_PEAKS.items() if k in name), None)
    memory = re.findall(r"peak_memory_bytes (\d+)", text)
    print(
        f"SpecForge {args.size} B={args.batch_size} T={args.len} K={args.ttt}: "
        f"{step_s * 1e3:8.1f} ms/step (median of {len(steps) - 1} logged), {tok_s:10.0f} tokens/s, "
        f"{flop_s / 1e9:9.1f} GFLOP/s"
        + (f", MFU {flop_s / peak:.1%} of {peak / 1e9:.0f} GFLOP/s" if peak else "")
        + (f", peak memory {int(memory[-1]) / 2**30:.1f} GiB" if memory else "")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("synth")
    s.add_argument("--out", required=True)
    s.add_argument("--samples", type=int, default=64)
    s.add_argument("--dtype", default="bfloat16", help="the aux states': float32 for a CPU run")
    s.add_argument("--tokenizer-from", default="models/toy-llama-deep")
    m = sub.add_parser("summarize")
    m.add_argument("--log", required=True)
    m.add_argument("--batch-size", type=int, default=2)
    m.add_argument("--ttt", type=int, default=7)
    m.add_argument("--peak", type=float, help="FLOP/s (default: bench_train's table)")
    for p in (s, m):
        p.add_argument("--size", choices=sorted(SIZES), default="realistic")
        p.add_argument("--len", type=int, default=2048)
    args = ap.parse_args()
    {"synth": synth, "summarize": summarize}[args.cmd](args)


if __name__ == "__main__":
    main()
