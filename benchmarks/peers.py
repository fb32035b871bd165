"""What the peer benchmarks share: a peer's EAGLE-3 weights scored by Eyrie's own evaluation.

``score(state, ...)`` loads a state dict already under Eyrie's Drafter names (``midlayer.*``,
``fc``, ``norm``, ``lm_head``, optionally ``d2t``/``t2d``) and runs Eyrie's offline acceptance
on the held-out stores: a peer's drafter and Eyrie's are scored on the same rows by the same code.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def stores(results: Path, split: str) -> list[Path]:
    return sorted((Path(results) / "store" / split).glob("shard-*.zarr"))


def drafter_from_state(state: dict, target: Path):
    """Eyrie's Drafter holding ``state``, its key/value heads read off ``k_proj``; a key it
    does not have, or lacks, stops the run."""
    from eyrie.train.model import Drafter, DrafterConfig

    config = json.loads((Path(target) / "config.json").read_text())
    N = state["lm_head.weight"].shape[0]
    cfg = DrafterConfig.from_target(config, num_aux=3, draft_vocab_size=N)
    kv = state["midlayer.self_attn.k_proj.weight"].shape[0] // cfg.head_dim
    cfg = DrafterConfig.from_target(
        config, num_aux=3, draft_vocab_size=N, overrides={"num_key_value_heads": kv}
    )
    model = Drafter(cfg)
    mine = model.state_dict()
    extra = sorted(set(state) - set(mine) - {"embed_tokens.weight"})
    if extra:  # e.g. input_norm: trained with norm_before_fc, a shape Eyrie does not have
        raise SystemExit(f"checkpoint holds {extra}: not the EAGLE-3 shape Eyrie trains")
    state = {k: v for k, v in state.items() if k in mine}
    if "d2t" not in state:  # full vocabulary: draft id = target id
        state["d2t"] = torch.zeros(N, dtype=torch.int64)
        state["t2d"] = torch.ones(cfg.vocab_size, dtype=torch.bool)
    missing = sorted(set(mine) - set(state))
    if missing:
        raise SystemExit(f"checkpoint lacks {missing}")
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return model.eval()


def score(state: dict, *, target, results, steps: int, max_len: int) -> dict:
    """Eyrie's held-out acceptance of a peer's drafter, as a dict (AcceptanceMetrics')."""
    from eyrie.evaluate.acceptance import evaluate_stores
    from eyrie.store.shard import ShardReader

    model = drafter_from_state(state, target)
    held = stores(results, "heldout")
    aux_ids = ShardReader(held[0]).aux_layer_ids
    res = evaluate_stores(
        model, aux_ids, str(target), held, steps=steps, batch_size=8, max_len=max_len
    ).to_dict()
    res["num_key_value_heads"] = model.config.num_key_value_heads
    return res


def save_as_drafter(state: dict, target, template, out, peer: dict) -> Path:
    """``state`` as an Eyrie drafter folder ``out`` (drafter.json + model.safetensors), so that
    ``eyrie export`` and ``eyrie speculate`` take a peer's drafter as they take Eyrie's own.

    drafter.json is ``template``'s (Eyrie's drafter trained on the same stores: the same aux
    layers and target) with the peer's shape; its ``train`` record names the peer's checkpoint,
    its ``draft_vocab`` record the peer's own mapping, and Eyrie's held-out summary goes."""
    from safetensors.torch import save_file

    model = drafter_from_state(state, target)
    meta = json.loads((Path(template) / "drafter.json").read_text())
    identity = f"{peer['tool']}-{peer['version']}-step{peer['step']}"
    meta.update(config=model.config.to_dict(), train={"steps": peer["step"], "identity": identity})
    meta["train"]["peer"] = peer
    meta["draft_vocab"] = {"source": f"{peer['tool']}'s own d2t and t2d, in the weights"}
    meta.pop("heldout", None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(weights, str(out / "model.safetensors"))
    (out / "drafter.json").write_text(json.dumps(meta, indent=2))  # last: the folder is whole
    return out
