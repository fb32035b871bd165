"""What the decoding loops run on: the target and drafter pair, the prompts, the stop tokens."""

from __future__ import annotations

import json

import torch

from eyrie.evaluate.draft_runner import DraftRunner
from eyrie.evaluate.target_runner import SpeculateError, Target

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_pair(target_dir, drafter_dir, device, dtype: str = "float32", architecture=None):
    """(Target, DraftRunner or a DFlash BlockRunner, tokenizer, drafter.json) on ``device``,
    both in ``dtype``."""
    from eyrie.evaluate.acceptance import load_drafter
    from eyrie.target.load import load_model, load_tokenizer

    if dtype not in DTYPES:
        raise SpeculateError(f"evaluate.dtype {dtype!r} is not one of {sorted(DTYPES)}")
    model, _ = load_model(target_dir, device, architecture)
    model = model.to(device, DTYPES[dtype])
    if torch.device(device).type == "cuda":
        # cuDNN's attention plans each new key length on the host, and batch-1 decoding meets a
        # new one every step (benchmarks/RESULTS.md, "The transformers loop on the H200")
        torch.backends.cuda.enable_cudnn_sdp(False)
    drafter, meta = load_drafter(drafter_dir, device)
    drafter = drafter.to(dtype=DTYPES[dtype])
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else None
    vocab = getattr(text or model.config, "vocab_size", None)
    if vocab is not None and int(vocab) != drafter.config.vocab_size:
        raise SpeculateError(
            f"the target in {target_dir} has {vocab} tokens, the drafter in {drafter_dir} "
            f"{drafter.config.vocab_size}: it was trained for another target"
        )
    target = Target(model, meta["aux_layer_ids"])
    if meta.get("method") == "dflash":
        from eyrie.evaluate.block_runner import BlockRunner

        head = model.get_output_embeddings().weight
        return target, BlockRunner(drafter, target.embed, head), load_tokenizer(target_dir), meta
    return target, DraftRunner(drafter, target.embed), load_tokenizer(target_dir), meta


def load_prompts(jsonl, tokenizer, n: int, max_prompt_tokens: int = 512) -> list[dict]:
    """The first ``n`` conversations' prompts, turn by turn. Each of a conversation's answers
    (its assistant turns, and one after each user turn that none answers: MT-bench's second
    question, prompts-only data; eyrie.data.chat_tokens.answer_slots) is a turn the loop
    decodes. ``input_ids``: the first turn's prompt (the turns before the first answer,
    rendered with the chat template's generation prompt) as token ids, at most
    ``max_prompt_tokens``; ``messages``: those turns; ``follow_ups``: the turns asked before
    each later answer, which eyrie.evaluate.compare.decode_turns renders after the loop's own
    answers."""
    from eyrie.data.chat_tokens import answer_slots, render

    prompts = []
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            if len(prompts) >= n:
                break
            if not line.strip():
                continue
            rec = json.loads(line)
            turns: list[list[dict]] = [[]]  # the messages before each answer
            for m in answer_slots(rec.get("messages") or []):
                if m.get("role") == "assistant":
                    turns.append([])
                else:
                    turns[-1].append(m)
            if len(turns) < 2 or not turns[0]:
                continue  # no answer, or one before any question
            text = render(tokenizer, turns[0], add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if 0 < len(ids) <= max_prompt_tokens:
                prompts.append(
                    {
                        "id": str(rec.get("id", len(prompts))),
                        "input_ids": ids,
                        "messages": turns[0],
                        "follow_ups": turns[1:-1],
                    }
                )
    if not prompts:
        raise SpeculateError(
            f"{jsonl} gave no prompt (a conversation with a user turn before an assistant turn, "
            f"at most {max_prompt_tokens} tokens); check the held-out dataset"
        )
    return prompts


def eos_ids(tokenizer, model_config) -> list[int]:
    ids = getattr(model_config, "eos_token_id", None)
    ids = ids if isinstance(ids, list) else [ids]
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted({int(i) for i in ids if i is not None})
