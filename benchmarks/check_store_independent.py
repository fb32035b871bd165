"""Check shard stores without Eyrie: only zarr, numpy and transformers, and the store contract.

For each store: every stored sample's token ids must equal the tokenizer's own chat tokenization
(cut to --max-tokens), and every stored layer must match a plain transformers forward pass with
output_hidden_states=True in cosine similarity (hidden_states[i + 1] is the output of decoder
layer i, hidden_states[-1] is after the final norm). Prints a table; exits 1 on any mismatch.

    python benchmarks/check_store_independent.py --target models/toy-llama \
        --data results/data/train.jsonl --max-tokens 512 results/store/train/shard-*.zarr
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import zarr
from transformers import AutoModelForCausalLM, AutoTokenizer


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """The contract stores bfloat16 as its uint16 bit pattern: the high half of a float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    num = (a * b).sum(-1)
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return num / np.maximum(den, 1e-30)


def check_store(path: Path, model, tokenizer, messages: dict, max_tokens: int, limit, device):
    group = zarr.open_group(str(path), mode="r")
    attrs = dict(group.attrs)
    problems = []
    if not attrs.get("complete"):
        problems.append("not complete")
    if attrs.get("layer_convention") != "output" or attrs.get("dtype") != "bfloat16":
        problems.append(f"unexpected layer_convention/dtype {attrs.get('layer_convention')}")
    aux_ids = list(attrs["aux_layer_ids"])
    n = int(json.loads((path / "commit.json").read_text())["num_samples"])
    offsets = np.asarray(group["offsets"][: n + 1])
    ids_all = [str(s) for s in group["sample_id"][:n]]
    layers = model.config.get_text_config().num_hidden_layers
    names = [f"aux_{i}" for i in aux_ids if i < layers - 1] + ["final"]
    worst = dict.fromkeys(names, 1.0)
    id_mismatch = 0
    picks = range(n) if limit is None else range(min(n, limit))
    tokens = 0
    for s in picks:
        lo, hi = int(offsets[s]), int(offsets[s + 1])
        ids = np.asarray(group["input_ids"][lo:hi], dtype=np.int64)
        tokens += hi - lo
        enc = tokenizer.apply_chat_template(messages[ids_all[s]], tokenize=True)
        ref = list(enc["input_ids"] if hasattr(enc, "keys") else enc)[:max_tokens]
        if ids.tolist() != ref:
            id_mismatch += 1
        with torch.inference_mode():
            out = model(torch.as_tensor(ids, device=device)[None], output_hidden_states=True)
        hs = [h[0].float().cpu().numpy() for h in out.hidden_states]
        aux = bf16_to_f32(np.asarray(group["aux_hidden"][lo:hi]))
        final = bf16_to_f32(np.asarray(group["final_hidden"][lo:hi]))
        for j, i in enumerate(aux_ids):
            if i < layers - 1:
                worst[f"aux_{i}"] = min(
                    worst[f"aux_{i}"], float(cosine(aux[:, j], hs[i + 1]).min())
                )
        worst["final"] = min(worst["final"], float(cosine(final, hs[-1]).min()))
    if id_mismatch:
        problems.append(f"{id_mismatch} samples with other input_ids than the tokenizer's")
    return {"store": str(path), "samples": len(picks), "tokens": tokens, **worst}, problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stores", nargs="+", type=Path)
    ap.add_argument("--target", required=True, help="the target's Hugging Face folder")
    ap.add_argument("--data", required=True, nargs="+", help="prepared split JSONL file(s)")
    ap.add_argument("--max-tokens", type=int, required=True, help="dataset.max_tokens")
    ap.add_argument("--samples", type=int, help="check only the first N samples of each store")
    ap.add_argument("--min-cosine", type=float, default=0.999)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype, local_files_only=True)
    model = model.to(args.device).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.target, local_files_only=True)
    messages = {}
    for path in args.data:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    obj = json.loads(line)
                    messages.setdefault(obj["id"], obj["messages"])

    rows, failed = [], False
    for store in args.stores:
        row, problems = check_store(
            store, model, tokenizer, messages, args.max_tokens, args.samples, args.device
        )
        low = [k for k, v in row.items() if isinstance(v, float) and v < args.min_cosine]
        problems += [f"{k} cosine {row[k]:.6f} < {args.min_cosine}" for k in low]
        row["problems"] = "; ".join(problems) or "ok"
        failed |= bool(problems)
        rows.append(row)

    cols = list(dict.fromkeys(k for r in rows for k in r))
    print("\t".join(cols))
    for r in rows:
        print(
            "\t".join(
                f"{r[c]:.6f}" if isinstance(r.get(c), float) else str(r.get(c, "-")) for c in cols
            )
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
