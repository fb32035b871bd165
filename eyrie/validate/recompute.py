"""The stored states against the target itself: a plain forward, and lm_head read alone.

A seeded few samples are run through transformers with output_hidden_states=True (not Eyrie's
hooks): every stored layer must match in cosine similarity, and lm_head over the stored final
states must give the forward's own greedy tokens, which a state taken before the final norm or
from the wrong layer fails even when it looks plausible.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from eyrie.store.codecs import round_bf16_bits
from eyrie.validate.problems import Problems
from eyrie.validate.store import bf16_to_f32, read_rows


def lm_head_weight(target_path: str | Path) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output projection read alone from safetensors (the input embedding when tied)."""
    from safetensors import safe_open

    from eyrie.target.load import TargetError, weight_files

    found: dict[str, tuple[Path, str]] = {}
    for f in weight_files(target_path):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():  # noqa: SIM118 - safe_open is not a dict
                for want in ("lm_head.weight", "lm_head.bias", "embed_tokens.weight"):
                    if key == want or key.endswith("." + want):
                        found.setdefault(want, (f, key))
    name = "lm_head.weight" if "lm_head.weight" in found else "embed_tokens.weight"
    if name not in found:
        raise TargetError(f"target.path: no lm_head.weight or embed_tokens.weight in {target_path}")

    def load(which):
        if which not in found:
            return None
        f, key = found[which]
        with safe_open(str(f), framework="pt") as st:
            return st.get_tensor(key)

    return load(name), load("lm_head.bias")


def spot_check(
    raw, picks, target, aux_ids, lm_head, p: Problems, min_cosine, min_greedy, keep=None
) -> dict:
    """Cosine per stored layer vs output_hidden_states, and greedy tokens via lm_head alone."""
    import torch.nn.functional as F

    model, dev = target.model, target.device
    num_layers = model.config.get_text_config().num_hidden_layers
    w, b = (t.to(dev, torch.float32) if t is not None else None for t in lm_head)
    names = [f"aux_{i}" for i in aux_ids] + ["final"]
    worst = dict.fromkeys(names, 1.0)
    match = total = 0
    for s in picks:
        arr = read_rows(raw, int(raw.offsets[s]), int(raw.offsets[s + 1]))
        ids = torch.as_tensor(np.asarray(arr["input_ids"], dtype=np.int64), device=dev)[None]
        with torch.inference_mode():
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        aux = torch.from_numpy(bf16_to_f32(np.asarray(arr["aux_hidden"]))).to(dev)
        final = torch.from_numpy(bf16_to_f32(np.asarray(arr["final_hidden"]))).to(dev)
        pairs = [
            (f"aux_{i}", aux[:, j], out.hidden_states[i + 1][0])
            for j, i in enumerate(aux_ids)
            if i < num_layers - 1
        ]  # hidden_states[L] is after the final norm
        pairs.append(("final", final, out.hidden_states[-1][0]))
        for name, got, ref in pairs:
            cos = F.cosine_similarity(got.float(), ref.float(), dim=-1, eps=1e-12)
            worst[name] = min(worst[name], float(cos.min()))
        logits = final @ w.T + (b if b is not None else 0)
        want = out.logits[0].float().argmax(-1)
        if keep is not None:  # a rounded store: the forward's own final state, rounded alike
            ref = _rounded(out.hidden_states[-1][0], keep).to(dev)
            want = (ref @ w.T + (b if b is not None else 0)).argmax(-1)
        match += int((logits.argmax(-1) == want).sum())
        total += ids.shape[1]
    for name, value in worst.items():
        if picks and value < min_cosine:
            p.add("cosine", None, f"{name}: min cosine {value:.6f} < {min_cosine}")
    rate = match / total if total else None
    if rate is not None and rate < min_greedy:
        p.add("greedy", None, f"{match}/{total} greedy tokens ({rate:.4f}) < {min_greedy}")
    checked = [n for n in names if n == "final" or int(n[4:]) < num_layers - 1]
    return {
        "spot_checked": [raw.sample_ids[s] for s in picks],
        "cosine": {n: worst[n] for n in checked} if picks else {},
        "min_cosine": min((worst[n] for n in checked), default=None) if picks else None,
        "greedy_match": rate,
        "greedy_tokens": total,
    }


def _rounded(states: torch.Tensor, keep: int) -> torch.Tensor:
    """float32 of bf16 states rounded to `keep` mantissa bits, as a bitround store holds them."""
    from eyrie.store.shard import bf16_bits

    bits = round_bf16_bits(bf16_bits(states.float().cpu()), keep)
    return torch.from_numpy(bf16_to_f32(bits))
