"""Held-out perplexity and top-1 next-token accuracy of toy-llama against a unigram baseline.

    python benchmarks/toy_llama_quality.py [--model models/toy-llama] [--data data/chat]

Both are measured in this run on the same held-out token stream; the unigram model is fitted on
the train split. Prints the ratios and the machine, plus greedy continuations of held-out text.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import transformers
from common import host_line, versions_line
from transformers import AutoModelForCausalLM, AutoTokenizer

from eyrie.target.toy.llama import encode_split, evaluate, unigram_baseline
from eyrie.target.toy.tokenizer import read_messages


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="models/toy-llama")
    p.add_argument("--data", default="data/chat")
    p.add_argument("--samples", type=int, default=3)
    args = p.parse_args()
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    data = Path(args.data)
    train = encode_split(tok, data / "train.jsonl")
    held = encode_split(tok, data / "heldout.jsonl")
    loss, acc = evaluate(model, held, seq_len=512)
    uni_loss, uni_acc = unigram_baseline(train, held, len(tok))
    print(host_line(), f"| torch threads {torch.get_num_threads()}")
    print(versions_line(transformers=transformers.__version__))
    print(f"held-out tokens: {len(held):,} (train {len(train):,})")
    print("| model | perplexity | top-1 accuracy |\n|---|---|---|")
    print(f"| toy-llama | {math.exp(loss):.2f} | {acc:.1%} |")
    print(f"| unigram (train counts) | {math.exp(uni_loss):.2f} | {uni_acc:.1%} |")
    print(
        f"perplexity ratio toy/unigram: {math.exp(loss) / math.exp(uni_loss):.4f}; "
        f"accuracy ratio: {acc / uni_acc:.2f}x"
    )
    for messages in list(read_messages(data / "heldout.jsonl"))[: args.samples]:
        answer = next(m["content"] for m in messages if m["role"] == "assistant")
        prompt = messages[: [m["role"] for m in messages].index("assistant")]
        ids = tok.apply_chat_template(
            prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        head = tok(answer[:60], add_special_tokens=False, return_tensors="pt")["input_ids"]
        ids = torch.cat([ids, head], dim=1)
        out = model.generate(ids, max_new_tokens=60, do_sample=False)
        print("\n---", json.dumps(prompt[-1]["content"]))
        print("given:    ", json.dumps(answer[:60]))
        print(
            "generated:", json.dumps(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=False))
        )
        print("reference:", json.dumps(answer[60:200]))


if __name__ == "__main__":
    main()
