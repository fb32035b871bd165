"""Where greedy speculative outputs differ from plain greedy outputs, and whether that is a tie.

Greedy speculative decoding must reproduce greedy decoding up to floating-point ties: where the
target's two best next tokens are (nearly) equal, a verify pass over several tokens and a
one-token decode step may round differently and pick different ones. For each prompt whose
EAGLE-3 output differs from the plain output, this finds the first differing position p and
recomputes, in float32 with transformers, the target's logits for the next token after
prompt + plain[:p] (one plain forward pass, no cache): the top-1 and top-2 logits and their
gap, and the logits of the two emitted tokens. A gap of about 1e-3 or less (bf16 serving) is a
tie; a large gap means the speculative path computed something else (drafter export, layer
ids, dtype, sampling backend).

    python benchmarks/identical_outputs.py --online results/evaluate/online_sglang.json \
        --target models/toy-llama [--mode cuda_graph|eager] [--out table.md]
    python benchmarks/identical_outputs.py --plain plain.json --spec spec.json --target T \
        [--prompts-jsonl data/chat/heldout.jsonl]

Inputs: eyrie.evaluate.online's JSON (per mode, ``runs.plain.rows`` and ``runs.eagle3.rows``:
``id``, ``output_ids`` and the prompt's ``input_ids``), or two files each holding such rows (a
list, or an object with ``rows``). Rows without ``input_ids`` take the prompts from
``--prompts-jsonl`` (eyrie.evaluate.loading.load_prompts, the same chat template), matched by id.
Prints a Markdown table (and writes it to ``--out``); needs torch and transformers only, plus
Eyrie for ``--prompts-jsonl``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


class InputError(ValueError):
    """An input file is not what this script reads; the message names it and the fix."""


def rows_of(obj, path: str, mode: str | None = None, run: str | None = None) -> list[dict]:
    """The per-prompt rows of one server's output in any of the accepted forms."""
    if isinstance(obj, dict) and "modes" in obj:
        modes = obj["modes"]
        if mode is None:
            mode = obj.get("mode") or next(iter(modes))
        if mode not in modes:
            raise InputError(f"{path} has modes {sorted(modes)}, not {mode!r}; pick with --mode")
        obj = modes[mode]
    if isinstance(obj, dict) and "runs" in obj:
        if run not in obj["runs"]:
            raise InputError(f"{path} has runs {sorted(obj['runs'])}, not {run!r}")
        obj = obj["runs"][run]
    rows = obj.get("rows") if isinstance(obj, dict) else obj
    if not isinstance(rows, list) or not all(
        isinstance(r, dict) and "id" in r and "output_ids" in r for r in rows
    ):
        raise InputError(
            f"{path}: expected rows with 'id' and 'output_ids' (eyrie.evaluate.online's JSON, or "
            "a list of such rows)"
        )
    return rows


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where the two token lists differ (one ending counts), or None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def differences(plain: list[dict], spec: list[dict], prompts: dict[str, list[int]]) -> list[dict]:
    """One record per prompt whose outputs differ: id, position, the two tokens, the context."""
    by_id = {r["id"]: r for r in spec}
    if set(by_id) != {r["id"] for r in plain}:
        raise InputError("the plain and the speculative outputs are not of the same prompt ids")
    out = []
    for row in plain:
        a, b = list(row["output_ids"]), list(by_id[row["id"]]["output_ids"])
        pos = first_difference(a, b)
        if pos is None:
            continue
        ids = row.get("input_ids") or by_id[row["id"]].get("input_ids") or prompts.get(row["id"])
        if ids is None:
            raise InputError(f"no prompt ids for {row['id']!r}: give --prompts-jsonl")
        turn = later_turn(row.get("turns"), pos)
        out.append(
            {
                "id": row["id"],
                "position": pos,
                "plain_token": a[pos] if pos < len(a) else None,
                "spec_token": b[pos] if pos < len(b) else None,
                # a later turn's context holds the next question too, which is not rebuilt here
                "context": None if turn else [*map(int, ids), *a[:pos]],
                "turn": turn + 1,
            }
        )
    return out


def later_turn(turns, pos: int) -> int:
    """The 0-based turn that output position `pos` falls in (rows of several turns list each
    turn's new tokens in `turns`, and `output_ids` holds them one after another)."""
    if not isinstance(turns, list):
        return 0
    end = 0
    for i, n in enumerate(turns):
        end += n
        if pos < end:
            return i
    return max(len(turns) - 1, 0)


@torch.no_grad()
def logit_gaps(model, diffs: list[dict]) -> list[dict]:
    """Each difference with the target's fp32 next-token logits after its context."""
    out = []
    for d in diffs:
        if d["context"] is None:
            out.append({k: v for k, v in d.items() if k != "context"})
            continue
        ids = torch.tensor([d["context"]], dtype=torch.long, device=model.device)
        logits = model(input_ids=ids).logits[0, -1].float()
        top = torch.topk(logits, 2)
        rec = {
            **{k: v for k, v in d.items() if k != "context"},
            "top1_token": int(top.indices[0]),
            "top2_token": int(top.indices[1]),
            "top1_logit": float(top.values[0]),
            "top2_logit": float(top.values[1]),
            "gap": float(top.values[0] - top.values[1]),
        }
        if d["plain_token"] is not None and d["spec_token"] is not None:
            rec["emitted_gap"] = float(logits[d["plain_token"]] - logits[d["spec_token"]])
        out.append(rec)
    return out


def table(recs: list[dict], prompts: int) -> str:
    lines = [
        f"Outputs identical on {prompts - len(recs)} of {prompts} prompts. Where they differ: "
        "the first differing position (0 = first new token) and the target's fp32 logits there.",
        "",
        "| prompt | position | plain token | EAGLE-3 token | top-1 (logit) | top-2 (logit) | "
        "top-1 − top-2 | logit(plain) − logit(EAGLE-3) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in recs:
        if "gap" not in r:
            lines.append(
                f"| {r['id']} | {r['position']} (turn {r['turn']}) | {_tok(r['plain_token'])} | "
                f"{_tok(r['spec_token'])} | not recomputed: a later turn's context holds the "
                "next question | | | |"
            )
            continue
        emitted = r.get("emitted_gap")
        lines.append(
            f"| {r['id']} | {r['position']} | {_tok(r['plain_token'])} | {_tok(r['spec_token'])} "
            f"| {r['top1_token']} ({r['top1_logit']:.4f}) | {r['top2_token']} "
            f"({r['top2_logit']:.4f}) | {r['gap']:.4g} | "
            f"{'' if emitted is None else f'{emitted:.4g}'} |"
        )
    return "\n".join(lines) + "\n"


def _tok(t) -> str:
    return "(ended)" if t is None else str(t)


def _read(path: str):
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    except ValueError as exc:
        raise InputError(
            f"{path} is not JSON ({exc}); give eyrie.evaluate.online's output"
        ) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--online", help="eyrie.evaluate.online's JSON (both servers' outputs)")
    ap.add_argument("--mode", help="with --online: cuda_graph or eager (default: its headline)")
    ap.add_argument("--plain", help="plain server's rows (instead of --online)")
    ap.add_argument("--spec", help="EAGLE-3 server's rows (instead of --online)")
    ap.add_argument("--target", required=True, help="target model folder (transformers)")
    ap.add_argument("--prompts-jsonl", help="chat JSONL, for rows without input_ids")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", help="also write the Markdown table here")
    args = ap.parse_args(argv)
    try:
        if args.online:
            rec = _read(args.online)
            plain = rows_of(rec, args.online, args.mode, "plain")
            spec = rows_of(rec, args.online, args.mode, "eagle3")
        elif args.plain and args.spec:
            plain = rows_of(_read(args.plain), args.plain, args.mode, "plain")
            spec = rows_of(_read(args.spec), args.spec, args.mode, "eagle3")
        else:
            raise InputError("give --online FILE, or both --plain FILE and --spec FILE")
        prompts = {}
        if args.prompts_jsonl:
            sys.path.insert(0, str(ROOT))
            from eyrie.evaluate.loading import load_prompts
            from eyrie.target.load import load_tokenizer

            loaded = load_prompts(args.prompts_jsonl, load_tokenizer(args.target), len(plain))
            prompts = {p["id"]: p["input_ids"] for p in loaded}
        diffs = differences(plain, spec, prompts)
    except InputError as exc:
        print(f"identical_outputs: {exc}", file=sys.stderr)
        return 2
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32)
    model.to(args.device).eval()
    text = table(logit_gaps(model, diffs), len(plain))
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
