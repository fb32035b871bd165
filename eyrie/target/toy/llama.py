"""Train toy-llama, the shipped default target: a small Llama (GQA, RoPE) on the shipped chat text.

    python -m eyrie.target.toy.llama --data data/chat --out models/toy-llama            # CPU: slow
    python -m eyrie.target.toy.llama --data data/chat --out models/toy-llama --device cuda

The tokenizer is trained first (byte-level BPE, 4,096 tokens), then the model, on the train split
rendered with the chat template; the held-out split gives the reported perplexity and accuracy.
The checkpoint with the best held-out loss is written as a standard transformers folder.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from eyrie.target.toy.tokenizer import (
    read_messages,
    render,
    save_hf_tokenizer,
    special_token_ids,
    train_tokenizer,
)

SEED = 1234


# toy-llama's shape; `--layers 24 --hidden 128 --intermediate 352 --heads 4` gives
# toy-llama-deep, a target as deep as real ones relative to a one-layer drafter.
SHAPE = {"layers": 8, "hidden": 256, "intermediate": 704, "heads": 8, "kv_heads": 2}


def toy_llama_config(tokenizer, shape: dict | None = None):
    from transformers import LlamaConfig

    shape = {**SHAPE, **(shape or {})}
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],  # GQA: query heads share key/value heads
        max_position_embeddings=1024,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        **special_token_ids(tokenizer),
        torch_dtype="bfloat16",
    )


def encode_split(tokenizer, path: Path) -> torch.Tensor:
    """All conversations of a split, rendered and tokenized, as one token stream."""
    texts = [render(m) for m in read_messages(path)]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return torch.tensor([t for doc in ids for t in doc], dtype=torch.long)


@torch.no_grad()
def evaluate(model, tokens: torch.Tensor, seq_len: int = 512, batch: int = 16, device="cpu"):
    """Mean next-token loss and top-1 accuracy over non-overlapping windows of the stream."""
    model.eval()
    n = (len(tokens) - 1) // seq_len
    x = tokens[: n * seq_len].view(n, seq_len)
    y = tokens[1 : n * seq_len + 1].view(n, seq_len)
    nll, correct, count = 0.0, 0, 0
    for i in range(0, n, batch):
        xb, yb = x[i : i + batch].to(device), y[i : i + batch].to(device)
        logits = model(input_ids=xb).logits.float()
        nll += F.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="sum").item()
        correct += (logits.argmax(-1) == yb).sum().item()
        count += yb.numel()
    model.train()
    return nll / count, correct / count


def unigram_baseline(train: torch.Tensor, heldout: torch.Tensor, vocab: int):
    """Held-out loss and top-1 accuracy of a unigram model fitted on the train stream."""
    counts = torch.bincount(train, minlength=vocab).double() + 1.0  # add-one smoothing
    logp = (counts / counts.sum()).log()
    target = heldout[1:]
    return -logp[target].mean().item(), (target == counts.argmax()).double().mean().item()


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(args) -> dict:
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.manual_seed(SEED)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(args.data)
    if not (out / "tokenizer.json").exists() or args.retrain_tokenizer:
        texts = [render(m) for m in read_messages(data / "train.jsonl")]
        save_hf_tokenizer(train_tokenizer(texts, vocab_size=args.vocab), out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    if args.tokenizer_only:
        return {}
    train_ids = encode_split(tokenizer, data / "train.jsonl")
    held_ids = encode_split(tokenizer, data / "heldout.jsonl")
    print(f"train tokens {len(train_ids):,}  held-out tokens {len(held_ids):,}", flush=True)

    device = torch.device(args.device)
    cfg = toy_llama_config(tokenizer, {k: getattr(args, k) for k in SHAPE})
    model = LlamaForCausalLM(cfg).to(device)
    print(f"parameters {sum(p.numel() for p in model.parameters()):,}", flush=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(SEED)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else None
    best, best_state, log = float("inf"), None, []
    t0 = time.time()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        starts = torch.randint(0, len(train_ids) - args.seq_len - 1, (args.batch,), generator=gen)
        x = torch.stack([train_ids[s : s + args.seq_len] for s in starts]).to(device)
        y = torch.stack([train_ids[s + 1 : s + args.seq_len + 1] for s in starts]).to(device)
        with amp if amp else torch.enable_grad():
            logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            held_loss, held_acc = evaluate(model, held_ids, args.seq_len, device=device)
            row = {
                "step": step + 1,
                "train_loss": round(loss.item(), 4),
                "heldout_loss": round(held_loss, 4),
                "heldout_acc": round(held_acc, 4),
                "seconds": round(time.time() - t0, 1),
            }
            log.append(row)
            print(json.dumps(row), flush=True)
            if held_loss < best:
                best = held_loss
                best_state = {
                    k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()
                }
    model.load_state_dict(best_state)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    return {"best_heldout_loss": best}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/chat")
    p.add_argument("--out", default="models/toy-llama")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=250)
    for key, value in SHAPE.items():
        p.add_argument(f"--{key.replace('_', '-')}", type=int, default=value, dest=key)
    p.add_argument("--tokenizer-only", action="store_true")
    p.add_argument("--retrain-tokenizer", action="store_true")
    train(p.parse_args(argv))


if __name__ == "__main__":
    main()
