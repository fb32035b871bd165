"""Compare two extractions of the same samples, e.g. the SGLang and the transformers backend.

Samples are matched by id over all shard stores of each side. Token ids and loss masks must be
identical; for the first few samples whose ids differ the report gives both lengths and the first
differing position, so a comparison that matches nothing says why (stores made from other
conversations, another chat template, another cut). Hidden states are compared per token in
cosine similarity (float32 of the stored bfloat16), for each aux layer and the final state. A
layer passes when its mean per-token cosine reaches `min_cosine`; the worst token and the share
of tokens below the bar are reported too, since two engines legitimately differ a little (other
kernels, bf16 rounding, and on MoE targets the odd token whose expert choice flips on a near
tie).

The command line is `eyrie compare-stores` (eyrie/cli/store.py).
"""

from __future__ import annotations

import numpy as np
import torch

from eyrie.store.shard import ShardReader

# samples whose id differences are described one by one (the rest are only counted)
DESCRIBED = 5


def _index(paths: list) -> dict[str, tuple[ShardReader, int]]:
    out: dict[str, tuple[ShardReader, int]] = {}
    for path in paths:
        reader = ShardReader(path, require_complete=True)
        for i, sid in enumerate(reader.sample_ids):
            if sid in out:
                raise ValueError(f"sample {sid!r} is in two stores of one side ({path})")
            out[sid] = (reader, i)
    return out


def token_cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine of matching rows (last axis); 1 where both rows are zero, 0 where one is."""
    a, b = a.float(), b.float()
    dot = (a * b).sum(-1)
    na, nb = a.norm(dim=-1), b.norm(dim=-1)
    cos = dot / (na * nb).clamp_min(1e-30)
    both_zero = (na == 0) & (nb == 0)
    return torch.where(both_zero, torch.ones_like(cos), cos)


def ids_difference(sid: str, a: torch.Tensor, b: torch.Tensor) -> dict:
    """How two token sequences of one sample differ: both lengths and the first position where
    they part (the shorter length when one is a prefix of the other)."""
    n = min(len(a), len(b))
    differ = torch.nonzero(a[:n] != b[:n])
    first = int(differ[0, 0]) if len(differ) else n
    return {"sample_id": sid, "tokens_a": len(a), "tokens_b": len(b), "first_difference": first}


def compare(stores_a: list, stores_b: list, *, min_cosine: float = 0.999) -> dict:
    """The comparison report; `ok` says whether ids match and every layer reaches the bar."""
    a, b = _index(stores_a), _index(stores_b)
    first = next(iter(a.values()))[0] if a else None
    other = next(iter(b.values()))[0] if b else None
    aux_ids = first.aux_layer_ids if first else []
    if first and other and first.aux_layer_ids != other.aux_layer_ids:
        raise ValueError(
            f"the two sides store other aux layers: {first.aux_layer_ids} vs {other.aux_layer_ids}"
        )
    names = [f"aux {i}" for i in aux_ids] + ["final"]
    cosines: dict[str, list[np.ndarray]] = {n: [] for n in names}
    ids_diff, described, mask_diff, tokens = [], [], [], 0
    shared = [sid for sid in a if sid in b]
    for sid in shared:
        x = a[sid][0][a[sid][1]]
        y = b[sid][0][b[sid][1]]
        if not torch.equal(x["input_ids"], y["input_ids"]):
            ids_diff.append(sid)
            if len(described) < DESCRIBED:
                described.append(ids_difference(sid, x["input_ids"], y["input_ids"]))
            continue
        if not torch.equal(x["loss_mask"], y["loss_mask"]):
            mask_diff.append(sid)
        tokens += len(x["input_ids"])
        for j, name in enumerate(names[:-1]):
            cos = token_cosine(x["aux_hidden"][:, j], y["aux_hidden"][:, j])
            cosines[name].append(cos.numpy())
        cosines["final"].append(token_cosine(x["final_hidden"], y["final_hidden"]).numpy())
    layers = {}
    for name in names:
        c = np.concatenate(cosines[name]) if cosines[name] else np.zeros(0)
        layers[name] = {
            "mean": float(c.mean()) if c.size else None,
            "min": float(c.min()) if c.size else None,
            "p01": float(np.percentile(c, 1)) if c.size else None,
            "below": float((c < min_cosine).mean()) if c.size else None,
            "ok": bool(c.size) and float(c.mean()) >= min_cosine,
        }
    report = {
        "stores_a": [str(p) for p in stores_a],
        "stores_b": [str(p) for p in stores_b],
        "samples": len(shared),
        "tokens": tokens,
        "only_in_a": sorted(set(a) - set(b))[:20],
        "only_in_b": sorted(set(b) - set(a))[:20],
        "only_in_a_count": len(set(a) - set(b)),
        "only_in_b_count": len(set(b) - set(a)),
        "input_ids_differ": ids_diff[:20],
        "input_ids_differ_count": len(ids_diff),
        "input_ids_differences": described,
        "loss_mask_differ": mask_diff[:20],
        "min_cosine": min_cosine,
        "layers": layers,
    }
    report["input_ids_identical"] = not ids_diff and set(a) == set(b) and bool(shared)
    report["ok"] = (
        report["input_ids_identical"] and not mask_diff and all(v["ok"] for v in layers.values())
    )
    return report


def render(report: dict) -> str:
    lines = [
        f"samples {report['samples']}, tokens {report['tokens']}, input_ids identical: "
        f"{report['input_ids_identical']}, loss masks identical: {not report['loss_mask_differ']}",
        f"{'layer':<10} {'mean cos':>10} {'p01':>10} {'min':>10} {'< bar':>8}",
    ]
    for name, v in report["layers"].items():
        if v["mean"] is None:
            lines.append(f"{name:<10} {'-':>10}")
            continue
        lines.append(
            f"{name:<10} {v['mean']:>10.6f} {v['p01']:>10.6f} {v['min']:>10.6f} {v['below']:>8.2%}"
        )
    lines += ids_report_lines(report)
    lines.append(
        f"{'PASS' if report['ok'] else 'FAIL'} (bar: mean cosine >= {report['min_cosine']})"
    )
    return "\n".join(lines)


def ids_report_lines(report: dict) -> list[str]:
    """Plain lines on what keeps the two sides' samples apart; none when nothing does."""
    lines = []
    for side in ("a", "b"):
        only, count = report[f"only_in_{side}"], report[f"only_in_{side}_count"]
        if count:
            more = " ..." if count > len(only) else ""
            lines.append(f"{count} samples only in {side}: {', '.join(only)}{more}")
    count = report["input_ids_differ_count"]
    if count:
        lines.append(f"input_ids differ in {count} of {report['samples']} shared samples:")
    for d in report["input_ids_differences"]:
        lines.append(
            f"  {d['sample_id']}: {d['tokens_a']} tokens in a, {d['tokens_b']} in b, "
            f"first differing token at position {d['first_difference']}"
        )
    return lines
