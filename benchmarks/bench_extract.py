"""Extraction time against a bare forward pass of the same batches (goal: at most 1.10x).

The baseline runs the target on exactly the batches extraction runs (same samples, same padding,
same order), with no hooks and nothing kept: the cost any capture must pay. Extraction is timed
by eyrie.extract itself, without its setup (model load, tokenization, hashing): capture (forward
with hooks up to the final norm, copies to the CPU) plus write (bf16 bits, compression, commits).
Both use the same loaded, warmed-up model; runs alternate and the median of each is reported,
with the machine. On a shared machine, run it when nothing else does: the ratio is only as
steady as the CPU is free.

    python benchmarks/bench_extract.py                    # shipped toy-llama, CPU
    python benchmarks/bench_extract.py --device cuda --samples 1024
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tiny_target, for a stand-in when toy-llama is absent

from eyrie.extract import _batches, _groups, _tokenize, extract_shard, read_split  # noqa: E402
from eyrie.target import load_target  # noqa: E402


def machine(device: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name() if device == "cuda" else "none"
    return (
        f"{platform.node()} | {platform.platform()} | CPU {cpu}, {os.cpu_count()} cores, "
        f"torch threads {torch.get_num_threads()} | GPU {gpu} | torch {torch.__version__}"
    )


def target_dir(arg: str | None, tmp: Path) -> Path:
    if arg:
        return Path(arg)
    toy = ROOT / "models" / "toy-llama"
    if (toy / "config.json").is_file() and list(toy.glob("*.safetensors")):
        return toy
    from tiny_target import build_llama

    print("models/toy-llama is absent: a random Llama of the same shape stands in")
    return build_llama(tmp / "random-llama", layers=8, hidden=256)


def split_file(arg: str | None, n: int, tmp: Path) -> Path:
    src = Path(arg) if arg else ROOT / "data" / "chat" / "train.jsonl"
    out = tmp / "train.jsonl"
    if src.is_file():
        lines = [ln for ln in src.read_text(encoding="utf-8").splitlines() if ln.strip()][:n]
    else:
        from tiny_target import conversation

        lines = [json.dumps({"id": f"s{i}", "messages": conversation(i % 40, 2)}) for i in range(n)]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def bare_forward(model, batches, pad_id: int, device) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        for seqs in batches:
            ids = torch.full((len(seqs), max(map(len, seqs))), pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for r, s in enumerate(seqs):
                ids[r, : len(s)] = torch.as_tensor(s.astype(np.int64))
                mask[r, : len(s)] = 1
            model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="HF folder (default: models/toy-llama)")
    ap.add_argument("--data", help="split JSONL (default: data/chat/train.jsonl)")
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--commit-every", type=int, default=64)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        target_path = target_dir(args.target, tmp)
        data = split_file(args.data, args.samples, tmp)
        target = load_target(target_path, device=args.device)
        capture = {
            "backend": "hf",
            "aux_layer_ids": None,
            "device": args.device,
            "batch_size": args.batch_size,
        }
        extract = {"shards": 1, "chunk_tokens": 256, "shard_tokens": 16384}
        commit_every = max(
            args.batch_size, -(-args.commit_every // args.batch_size) * args.batch_size
        )
        good, _ = _tokenize(target.tokenizer, read_split(data), args.max_tokens)
        batches = [
            [group[i].input_ids for i in batch]
            for group in _groups(good, commit_every, set(), set())
            for batch in _batches(group, args.batch_size)
        ]
        pad = target.tokenizer.pad_token_id or 0
        tokens = sum(len(g.input_ids) for g in good)
        bare_forward(target.model, batches[:2], pad, target.device)  # warm-up

        base = target.model.get_decoder()  # the same stack without the lm_head
        bare, bare_base, runs = [], [], []
        for r in range(args.repeats):
            bare.append(bare_forward(target.model, batches, pad, target.device))
            bare_base.append(bare_forward(base, batches, pad, target.device))
            out = extract_shard(
                data_path=data,
                target_path=target_path,
                split="train",
                shard=0,
                out_store=tmp / f"run{r}" / "shard-000.zarr",
                errors_csv=tmp / f"run{r}" / "shard-000.errors.csv",
                capture=capture,
                extract=extract,
                max_tokens=args.max_tokens,
                commit_every=args.commit_every,
                progress=False,
                target=target,
            )
            runs.append(out.seconds)
        stored = sum(f.stat().st_size for f in (tmp / "run0").rglob("*") if f.is_file())

    med = statistics.median
    b = med(bare)
    cap = med(s["capture"] for s in runs)
    wr = med(s["write"] for s in runs)
    loop = med(s["total"] - s["setup"] for s in runs)
    print(f"machine:  {machine(target.device.type)}")
    print(
        f"target:   {target_path} ({sum(p.numel() for p in target.model.parameters()) / 1e6:.1f} M "
        f"params, {target.dtype}, {target.device})"
    )
    print(
        f"workload: {len(good)} samples, {tokens} tokens, {len(batches)} batches of <= "
        f"{args.batch_size}, max_tokens {args.max_tokens}, {args.repeats} repeats (median)"
    )
    print(f"bare forward (full model):      {b:8.3f} s  {tokens / b:9.0f} tok/s")
    bb = med(bare_base)
    print(f"bare forward (no lm_head):      {bb:8.3f} s  {tokens / bb:9.0f} tok/s")
    print(f"extract: capture                {cap:8.3f} s")
    print(f"extract: write + commit         {wr:8.3f} s")
    print(f"extract: loop (capture+write+finish) {loop:8.3f} s  {tokens / loop:9.0f} tok/s")
    print(f"store size: {stored / 1e6:.2f} MB ({stored / tokens:.0f} B/token)")
    print(
        f"ratio extract / bare forward without lm_head: {loop / bb:.3f}x (capture alone "
        f"{cap / bb:.3f}x: the hooks' own cost)"
    )
    ratio = loop / b
    print(
        f"ratio extract / bare forward:   {ratio:.3f}x  (goal <= 1.10x: "
        f"{'met' if ratio <= 1.10 else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
