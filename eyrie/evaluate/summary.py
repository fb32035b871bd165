"""The run's summary in words: the verdict line, the numbers behind it, and the tables.

Every input but the acceptance metrics is optional, so a partial run still gets a summary that
says plainly what was not measured. Speed comes from SGLang's own measurement when it ran
(the served setting), else from the transformers loop of eyrie.evaluate.speculate; a ratio below
1.0 is the first thing the summary says, in capitals. The figures are eyrie.evaluate.figures';
eyrie.evaluate.report writes both, and the HTML report's landing page.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from eyrie.data.problems import Skipped, read_skipped


@dataclass
class Inputs:
    acceptance: dict | None = None  # eyrie evaluate's JSON
    speculate: dict | None = None  # eyrie speculate's JSON (transformers loop)
    online: dict | None = None  # the online SGLang JSON (status ok or not run)
    train_metrics: pd.DataFrame | None = None  # train metrics.csv
    validate: pd.DataFrame | None = None  # validate/summary.csv
    baselines: dict | None = (
        None  # eyrie.evaluate.baselines.measure's JSON (evaluate/baselines.json)
    )
    dataset: list[Skipped] = field(default_factory=list)  # each split's skipped lines


def read_inputs(
    acceptance=None,
    speculate=None,
    online=None,
    train_metrics=None,
    validate=None,
    baselines=None,
    problems=(),
) -> Inputs:
    """Read whichever files are given and exist; a missing file is reported, not fatal.
    `problems`: the splits' problems tables (data/SPLIT.problems.csv)."""

    def js(p):
        return json.loads(Path(p).read_text()) if p and Path(p).is_file() else None

    def csv(p):
        if not p or not Path(p).is_file():
            return None
        try:
            return pd.read_csv(p)
        except pd.errors.EmptyDataError:
            return pd.DataFrame()

    skipped = [s for s in map(read_skipped, problems or ()) if s is not None]
    return Inputs(
        js(acceptance),
        js(speculate),
        js(online),
        csv(train_metrics),
        csv(validate),
        js(baselines),
        skipped,
    )


# ---------------------------------------------------------------------------------------------
# numbers and the verdict


def _pct(x) -> str:
    return "n/a" if x is None or _nan(x) else f"{100 * x:.0f} %"


def _nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def method_text(rec: dict) -> str:
    """The drafter a served record measured: SGLang's algorithm name as the report writes it."""
    names = {"DFLASH": "DFlash", "NGRAM": "NGRAM lookup (no drafter)"}
    return names.get(str(rec.get("algorithm", "EAGLE3")).upper(), "EAGLE-3")


WALK_TOLERANCE = 0.1  # served and offline accept length of one drafter on the same questions


def walk_text(served: dict, acceptance: dict | None) -> str:
    """A served chain's accept length beside the offline decoding walk of the same drafter at the
    same draft count: they measure one thing, so a gap past WALK_TOLERANCE points at the export
    (layer ids, vocab map) or at prompts that are not the held-out ones."""
    walk = (acceptance or {}).get("walk_accept_length_by_draft_tokens") or []
    k, length = served.get("draft_tokens"), served.get("accept_length")
    if int(served.get("topk") or 1) != 1 or not k or length is None or len(walk) < k:
        return ""
    if served.get("algorithm") == "NGRAM":  # the walk is the drafter's
        return ""
    gap = length - walk[k - 1]
    text = f" (offline walk {walk[k - 1]:.2f}, served {gap:+.2f})"
    if abs(gap) > WALK_TOLERANCE:
        text += (
            f" **more than {WALK_TOLERANCE} apart: check that SGLang serves the held-out "
            "questions (evaluate.sglang.prompts) and the export's layer ids and vocab map**"
        )
    return text


def shape_text(rec: dict) -> str:
    """How a decoding record drafted: "3 draft tokens" (a chain) or the tree's shape."""
    k, topk = rec.get("draft_tokens"), int(rec.get("topk") or 1)
    if rec.get("method") == "dflash":
        return f"DFlash: blocks of {k + 1} ({k} draft tokens), {rec.get('draft_layers')} layers"
    if topk == 1:
        return f"{k} draft tokens"
    return f"a tree of {k} steps × top-{topk}, {rec.get('verify_tokens')} tokens verified"


def speed(inp: Inputs) -> tuple[float | None, str, float | None, int | None]:
    """(speed-up over plain decoding, where it was measured, measured accept length, draft
    tokens), preferring SGLang's measurement."""
    o = inp.online or {}
    if o.get("status") == "ok" and o.get("speedup"):
        # several drafts served (evaluate.sglang.settings): the fastest is the verdict's
        drafters = [s for s in o.get("settings") or [o] if s.get("algorithm") != "NGRAM"]
        o = {**o, **max(drafters or [o], key=lambda s: s.get("speedup") or 0.0)}
        k = o.get("draft_tokens")
        mode = {"cuda_graph": "CUDA graphs", "eager": "eager"}.get(o.get("mode"), "eager")
        where = f"SGLang {method_text(o)}, {shape_text(o)}, {mode}"
        return float(o["speedup"]), where, o.get("accept_length"), k
    s = inp.speculate or {}
    if s.get("speedup") is not None and not _nan(s["speedup"]):
        m = s.get("machine") or {}
        k = s.get("draft_tokens")
        spread = repeats_text(s)
        where = f"transformers loop, {spread + ', ' if spread else ''}{shape_text(s)}, "
        where += f"{s.get('device', '?')}: "
        where += m.get("gpu") or m.get("cpu", "?")
        return float(s["speedup"]), where, s.get("accept_length"), k
    return None, "not measured", None, None


def difference_text(s: dict) -> str:
    """Where outputs differ: the target's top-two logit gap where each first parts."""
    gaps = [g for g in s.get("difference_margins") or [] if g is not None]
    if not gaps:
        return ""
    shown = ", ".join(f"{g:.3g}" for g in sorted(gaps)[:5])
    return (f" (where not, plain greedy's top two logits were {shown} apart at the first "
            f"differing token, {s.get('dtype', '?')})")  # fmt: skip


def parted_text(differences) -> str:
    """Served outputs that part from plain's: at which new token, the first few."""
    if not differences:
        return ""
    shown = ", ".join(f"{d['id']} at token {d['index']}" for d in differences[:4])
    more = f" and {len(differences) - 4} more" if len(differences) > 4 else ""
    return f"; outputs part: {shown}{more}"


def repeats_text(s: dict) -> str:
    """'median of 3 interleaved repeats, 0.70-0.76×' for a record of interleaved repeats
    (eyrie/evaluate/compare.py); '' for an older record that timed one pass."""
    n = s.get("repeats")
    if not n:
        return ""
    if n == 1:
        return "one interleaved pass"
    lo, hi = s.get("speedup_min"), s.get("speedup_max")
    if lo is None or hi is None or _nan(lo) or _nan(hi):
        return f"median of {n} interleaved repeats"
    return f"median of {n} interleaved repeats, {lo:.2f}-{hi:.2f}×"


def extraction_errors(inp: Inputs) -> int | None:
    df = inp.validate
    if df is None or df.empty or "errors" not in df:
        return None
    total = df[df["split"].astype(str) == "all"] if "split" in df else df.iloc[0:0]
    return int(total["errors"].iloc[-1]) if len(total) else int(df["errors"].sum())


def _fmt(x, spec: str = ".2f") -> str:
    if x is None or _nan(x):
        return "-"
    return format(x, spec)


def verdict(inp: Inputs) -> str:
    """One line in plain words: how much faster speculation is than plain decoding (loud when
    it is slower), where that was measured, and the errors. The acceptance numbers behind it
    are the lines under it (key_numbers), each with what it means."""
    ratio, where, measured, _ = speed(inp)
    if measured is not None and not _nan(measured):
        where += f"; {measured:.2f} tokens/verify step"
    if ratio is None:
        parts = ["speculation speed not measured"]
    elif ratio < 1.0:
        parts = [f"**SPECULATION IS SLOWER THAN PLAIN DECODING: {ratio:.2f}×** ({where})"]
    else:
        parts = [f"speculation {ratio:.2f}× faster than plain decoding ({where})"]
    errors = extraction_errors(inp)
    parts.append("extraction errors unknown" if errors is None else f"{errors} extraction errors")
    bad = sum(s.bad for s in inp.dataset)
    if bad:
        parts.append(f"{bad} bad dataset line{'s' * (bad != 1)} skipped (listed below)")
    return "; ".join(parts)


def key_numbers(inp: Inputs) -> list[str]:
    """The offline acceptance behind the verdict, one Markdown item per number, each with what
    it means: the one place the summary explains acc_0, acc_1|0, the decoding walk and τ+1."""
    a = inp.acceptance or {}
    acc, cond = a.get("acc") or [], a.get("cond_acc") or []
    lines = []
    if acc:
        acc0 = f"- acc_0 {_pct(acc[0])}"
        b = inp.baselines or {}
        if b.get("probe"):  # the drafter's step-0 inputs without attention over the context
            probe = b["probe"]
            acc0 += (
                f" ({probe.get('epochs', '?')}-epoch probe {_pct(probe['acc'])}, "
                f"bigram {_pct(b.get('bigram_acc'))})"
            )
        lines.append(
            f"{acc0}: how often the drafter's first draft token is the target's own (greedy) "
            "next token, on held-out text"
        )
    if len(cond) > 1:
        lines.append(
            f"- acc_1|0 {_pct(cond[1])}: how often its second draft token is, given the first was"
        )
    taus = a.get("tau_by_draft_tokens") or []
    if taus:  # offline tokens per verify step, at the measured number of drafts when scored
        k = speed(inp)[3]
        K = k if k and k <= len(taus) else len(taus)
        walk = a.get("walk_accept_length_by_draft_tokens") or []
        if len(walk) >= K:  # what decoding the held-out answers would emit per verify step
            lines.append(
                f"- decoding walk {walk[K - 1]:.2f} tokens/verify step for a chain of {K} "
                "drafts: the held-out answers decoded offline, verify step by verify step, each "
                "step starting where the last one ended; what the transformers loop and "
                "SGLang's accept length measure"
            )
        lines.append(
            f"- τ+1 {taus[K - 1] + 1:.2f} for a chain of {K} drafts: the tokens per verify step "
            "expected from each position's acceptance alone (τ, the accepted drafts, is "
            "SpecForge's simulated length; +1 is the target's own token); the decoding walk "
            "is below it where acceptance comes in runs"
        )
    return lines


def dataset_lines(inp: Inputs) -> list[str]:
    """Each split's skipped dataset lines and the table that lists them with their fixes."""
    if not inp.dataset:
        return []
    return ["Dataset lines skipped (rule prepare_dataset):", ""] + [
        f"- {s.line()}" for s in inp.dataset
    ]


def extraction_line(inp: Inputs) -> str:
    df = inp.validate
    if df is None or df.empty or "split" not in df:
        return "no summary"
    total = df[df["split"].astype(str) == "all"]
    row = total.iloc[-1] if len(total) else df.sum(numeric_only=True)
    tokens, nbytes = int(row.get("tokens", 0)), float(row.get("bytes_stored", 0))
    errors = extraction_errors(inp)
    return f"{tokens:,} tokens, {nbytes / 2**20:.1f} MiB, {errors} errors"


# ---------------------------------------------------------------------------------------------
# the summary


def summary_markdown(inp: Inputs, figures: dict[str, Path] | None = None) -> str:
    lines = [verdict(inp), ""]
    for block in (key_numbers(inp), dataset_lines(inp)):
        lines += block + [""] if block else []
    lines += ["# Eyrie run report", ""]
    a = inp.acceptance
    if a:
        lines += [
            f"## Offline acceptance ({a.get('samples', '?')} held-out samples, "
            f"{a.get('full_chains', '?')} full chains of {a.get('steps')} drafts)",
            "",
            "| draft position k | acc_k | acc_k given 0..k-1 accepted | drafts 0..k accepted "
            "| greedy token in draft vocab | τ for K=k+1 | τ+1 | decoding walk, K=k+1 |",
            "|---|---|---|---|---|---|---|---|",
        ]
        walk = a.get("walk_accept_length_by_draft_tokens") or []
        for k in range(a["steps"]):
            tau = a["tau_by_draft_tokens"][k]
            w = f"{walk[k]:.2f}" if k < len(walk) else "n/a"
            lines.append(
                f"| {k} | {_pct(a['acc'][k])} | {_pct(a['cond_acc'][k])} | "
                f"{_pct(a['chain'][k])} | {_pct(a['reachable'][k])} | {tau:.2f} | {tau + 1:.2f} "
                f"| {w} |"
            )
        lines += ["", "(τ+1 and the decoding walk are as explained at the top.)", ""]
    else:
        lines += ["Offline acceptance: not measured.", ""]
    lines += baseline_lines(inp)
    lines += ["## Speculative decoding", ""]
    s = inp.speculate
    if s:
        m, spread = s.get("machine") or {}, repeats_text(s)
        spread = f" ({spread})" if spread else ""
        lines += [
            f"- transformers loop ({s.get('device', '?')}: {m.get('gpu') or m.get('cpu', '?')}, "
            f"{s.get('dtype', '?')}): plain {_fmt(s.get('plain_tokens_per_s'), '.1f')} tok/s, "
            f"speculative {_fmt(s.get('spec_tokens_per_s'), '.1f')} tok/s, "
            f"**{_fmt(s.get('speedup'))}×**{spread}; accept length {_fmt(s.get('accept_length'))} "
            f"with {shape_text(s)}; output identical to greedy on "
            f"{s.get('identical')}/{s.get('prompts')} prompts{difference_text(s)}",
        ]
    else:
        lines.append("- transformers loop: not run")
    o = inp.online
    if o and o.get("status") == "ok":
        for mode, m in (o.get("modes") or {o.get("mode", "eager"): o}).items():
            shown = {"cuda_graph": "CUDA graphs", "eager": "eager, --disable-cuda-graph"}
            for d in m.get("settings") or [m]:
                if d.get("status") == "failed":
                    lines.append(f"- SGLang online ({shown.get(mode, mode)}, {method_text(d)}): "
                                 f"not served: {d.get('reason')}")  # fmt: skip
                    continue
                lines.append(
                    f"- SGLang online ({shown.get(mode, mode)}, {shape_text(d)}): plain "
                    f"{_fmt(m.get('plain_tokens_per_s'), '.1f')} tok/s, {method_text(d)} "
                    f"{_fmt(d.get('spec_tokens_per_s'), '.1f')} tok/s, "
                    f"**{_fmt(d.get('speedup'))}×**; spec_accept_length "
                    f"{_fmt(d.get('accept_length'))}{walk_text(d, inp.acceptance)}; "
                    "identical outputs "
                    f"{d.get('identical')}/{m.get('prompts')}"
                    + (f" ({m['turns']} turns)" if m.get("turns") else "")
                    + parted_text(d.get("differences"))
                )
    else:
        reason = (o or {}).get("reason", "no record")
        lines.append(f"- SGLang online: not run: {reason}")
    lines += ["", "## Extraction", "", f"- {extraction_line(inp)}"]
    df = inp.train_metrics
    if df is not None and not df.empty and "step" in df:
        last = df.iloc[-1]
        accs = ", ".join(
            f"{c} {_pct(last[c])}" for c in df if c.startswith("acc_") and c[4:].isdigit()
        )
        lines += ["", "## Training", "", f"- {int(last['step'])} steps; last batch: {accs}"]
        lines += overfit_lines(df, (inp.acceptance or {}).get("acc"))
    if figures:
        lines += ["", "## Figures", ""]
        lines += [f"- [{name}]({Path(p).name})" for name, p in figures.items()]
    return "\n".join(lines) + "\n"


# training's acc_0 this far above held-out's says the data, not the recipe, is short: on
# SmolLM2, 300 conversations x 10 epochs gave 0.66 against 0.315 (RESULTS.md)
OVERFIT_GAP = 0.15


def overfit_lines(df: pd.DataFrame, held_acc: list | None) -> list[str]:
    """A warning when acc_0 over training's last tenth of steps is far above held-out's."""
    if not held_acc or "acc_0" not in df:
        return []
    tail = df["acc_0"].iloc[-max(1, len(df) // 10) :].mean()
    if tail - held_acc[0] <= OVERFIT_GAP:
        return []
    return [
        f"- **Overfit: acc_0 {_pct(tail)} on training's last tenth of steps against "
        f"{_pct(held_acc[0])} held-out.** The drafter fits its training conversations far "
        "better than new ones: train on more conversations (dataset.max_samples) or fewer "
        "epochs (train.epochs)."
    ]


def copy_lines(split: dict) -> list[str]:
    """The drafter's acc_0 on the rows the context lookup names and on the rest."""
    share, on, off = (split.get(k) for k in ("share", "acc0", "acc0_other_rows"))
    if share is None or _nan(share) or share == 0:  # not measured, or no such row
        return []
    return [
        "",
        f"On the {_pct(share)} of held-out rows whose greedy token the context lookup names "
        f"(the target repeating its context), the drafter's acc_0 is {_pct(on)}; on the other "
        f"rows {_pct(off)} (offline acceptance). A drafter that has learned to copy is right on "
        "most of the former.",
    ]


def baseline_lines(inp: Inputs) -> list[str]:
    """The drafter's acc_0 next to the baselines scored on the same held-out rows."""
    b, a = inp.baselines, inp.acceptance or {}
    if not b:
        return ["Baselines: not measured.", ""]
    acc0 = (a.get("acc") or [None])[0]
    rows = [("the drafter, acc_0", acc0)]
    rows.append(("bigram: x_{t+1} -> most frequent greedy token after it (train)", b["bigram_acc"]))
    for key, inputs in (("probe", "[aux_t, embed(x_{t+1})]"), ("probe_with_final", "+ final_t")):
        if b.get(key):
            p = b[key]
            rows.append((f"MLP probe per position on {inputs}, {p['epochs']} epoch(s)", p["acc"]))
    lookup = b.get("lookup_acc")
    if lookup is not None:
        n = b.get("lookup_max_n", "?")
        rows.append((f"context lookup: the token after the last {n} to 1 tokens' most recent "
                     "earlier occurrence in the sample (no training)", lookup))  # fmt: skip
    lines = [
        f"## Drafter vs baselines (step 0, {b['scored_heldout']} held-out rows, same rows)",
        "",
        "| predictor of the target's greedy token at t+1 | held-out acc |",
        "|---|---|",
    ]
    lines += [f"| {name} | {_pct(x)} |" for name, x in rows]
    lines += copy_lines(a.get("lookup_rows") or {})
    probe = (b.get("probe") or {}).get("acc")
    if acc0 is not None and probe is not None and acc0 <= probe:
        lines += ["", "**The drafter does not beat a probe without context on its own inputs.**"]
    if acc0 is not None and lookup is not None and acc0 < lookup:
        lines += [
            "",
            "**A lookup in the sample's own context beats the drafter:** the target repeats "
            "itself, and the drafter has not learned to copy (more conversations or training "
            "steps). Prompt lookup (SGLang's NGRAM speculation) drafts this way with no drafter.",
        ]
    return lines + [""]
