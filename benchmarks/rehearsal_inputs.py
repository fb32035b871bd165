"""Inputs of the scale rehearsal (scripts/gpu_rehearsal.sh): a random-weight target of a given
shape, and long conversations joined from the shipped ones up to a token count.

    python benchmarks/rehearsal_inputs.py target --shape 8b --out DIR
    python benchmarks/rehearsal_inputs.py conversations --target DIR --tokens 1e6 \\
        --max-tokens 2048 --out FILE

The target keeps toy-llama's tokenizer and chat template (its ids sit inside any shape's
vocabulary), so validation compares SGLang's states with a transformers forward of the same
saved weights. Random weights make regenerated answers noise, so the rehearsal joins shipped
conversations instead: conversations are appended until a sample would pass --max-tokens
(rendered with the chat template and counted), and the shipped set is walked again, under new
ids, until --tokens.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "models" / "toy-llama"
CHAT = ROOT / "data" / "chat" / "train.jsonl"
# hidden, layers, heads, kv heads, intermediate, vocab
SHAPES = {
    "8b": (4096, 32, 32, 8, 14336, 128256),  # Llama-3.1-8B's
    "tiny": (64, 8, 4, 2, 176, 4096),  # the CPU rehearsal's (8 layers: aux 1, 3, 4)
}


def build_target(shape: str, out: Path, seed: int = 0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv, inter, vocab = SHAPES[shape]
    cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
                      max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "chat_template.jinja"):
        shutil.copy(TOKENIZER / name, out / name)
    tok_cfg = json.loads((TOKENIZER / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok_cfg["model_max_length"] = cfg.max_position_embeddings  # the toy's 1,024 is its own
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=1), encoding="utf-8")
    return out


def conversations(target: Path, tokens: float, max_tokens: int, out: Path) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)

    def size(messages: list[dict]) -> int:
        text = tok.apply_chat_template(messages, tokenize=False)
        return len(tok(text, add_special_tokens=False)["input_ids"])

    shipped = [json.loads(line) for line in CHAT.read_text(encoding="utf-8").split("\n") if line]
    sizes = [size(r["messages"]) for r in shipped]  # a joined sample renders about their sum
    written, samples, parts, walk = 0, 0, [], 0  # parts: (messages, rendered size) to join
    with open(out, "w", encoding="utf-8") as f:

        def flush(parts: list[tuple[list[dict], int]]) -> list[tuple[list[dict], int]]:
            """Write the longest head of ``parts`` that renders within max_tokens; the rest
            starts the next sample."""
            nonlocal written, samples
            keep = len(parts)
            n = size([m for p, _ in parts for m in p])
            while keep > 1 and n > max_tokens:
                keep -= 1
                n = size([m for p, _ in parts[:keep] for m in p])
            messages = [m for p, _ in parts[:keep] for m in p]
            f.write(json.dumps({"id": f"long-{samples:07d}", "messages": messages}) + "\n")
            written, samples = written + n, samples + 1
            return parts[keep:]

        while written < tokens:
            walk += 1
            for rec, n in zip(shipped, sizes, strict=True):
                if n > max_tokens:
                    continue  # longer alone than a sample may be
                if parts and sum(k for _, k in parts) + n > max_tokens:
                    parts = flush(parts)
                    if written >= tokens:
                        break
                parts.append((rec["messages"], n))
    return {"samples": samples, "tokens": written, "walks": walk, "out": str(out)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("target")
    t.add_argument("--shape", choices=sorted(SHAPES), required=True)
    t.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("conversations")
    c.add_argument("--target", type=Path, required=True)
    c.add_argument("--tokens", type=float, required=True)
    c.add_argument("--max-tokens", type=int, default=2048)
    c.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.what == "target":
        print(build_target(args.shape, args.out))
    else:
        print(json.dumps(conversations(args.target, args.tokens, args.max_tokens, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
