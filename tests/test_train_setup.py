"""Shared setup for the training and export tests: a tiny random Llama target, train/heldout
shard stores of its hidden states (captured with a plain transformers forward pass, not with
Eyrie's extractor) and a draft vocabulary. Builds in about a second."""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_target import build_llama

from eyrie.store.shard import ShardWriter
from eyrie.train import vocab as draft_vocab

AUX = [1, 2, 4]  # output of decoder layers 1, 2 and 4 of a 6-layer target


def tiny_settings(**kw) -> dict:
    s = {
        "max_steps": 12,
        "batch_size": 4,
        "max_len": 64,
        "ttt_steps": 3,
        "lr": 3e-3,
        "warmup_steps": 2,
        "num_workers": 0,
        "checkpoint_every": 4,
        "device": "cpu",
    }
    s.update(kw)
    return s


def capture(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux (T, k, H), final (T, H)): hidden_states[i + 1] is the output of layer i."""
    with torch.no_grad():
        hs = model(ids[None], output_hidden_states=True).hidden_states
    aux = torch.stack([hs[i + 1][0] for i in AUX], dim=1)
    return aux, hs[-1][0]


def make_setup(root: Path, *, n_train=24, n_heldout=8, draft_size=64, seed=0) -> dict:
    from transformers import LlamaForCausalLM

    root = Path(root)
    target = build_llama(root / "target", layers=6, hidden=32, seed=seed)
    model = LlamaForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    paths = {}
    for split, n in (("train", n_train), ("heldout", n_heldout)):
        path = root / "store" / split / "shard-000.zarr"
        with ShardWriter(
            path,
            hidden_size=32,
            aux_layer_ids=AUX,
            provenance={"weights_sha256": "tiny", "split": split},
        ) as w:
            for i in range(n):
                T = int(torch.randint(10, 40, (1,), generator=g))
                ids = torch.randint(6, vocab, (T,), generator=g)
                mask = torch.ones(T, dtype=torch.bool)
                mask[:3] = False  # a "prompt" the drafter is not scored on
                aux, final = capture(model, ids)
                w.append(f"{split}-{i:03d}", ids, mask, aux, final)
            w.finish()
        paths[split] = [path]
    counts = draft_vocab.count_tokens(paths["train"], vocab)
    vocab_path = root / "draft_vocab" / "vocab.safetensors"
    draft_vocab.save(draft_vocab.build(counts, draft_size), vocab_path, {})
    return {
        "target": target,
        "train": paths["train"],
        "heldout": paths["heldout"],
        "vocab": vocab_path,
        "vocab_size": vocab,
    }
