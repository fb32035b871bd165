"""The run's report: figures, tables and a summary whose first line is the verdict.

Every input but the acceptance metrics is optional, so a partial run still gets a report that
says plainly what was not measured. Speed comes from SGLang's own measurement when it ran
(the served setting), else from the transformers loop of eyrie.evaluate.speculate; a ratio below 1.0
is the first thing the summary says, in capitals.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from eyrie.common.atomic import atomic_path, write_text

FIGURES = ("acceptance", "tau", "training", "extraction", "speed")


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


def read_inputs(
    acceptance=None, speculate=None, online=None, train_metrics=None, validate=None, baselines=None
) -> Inputs:
    """Read whichever files are given and exist; a missing file is reported, not fatal."""

    def js(p):
        return json.loads(Path(p).read_text()) if p and Path(p).is_file() else None

    def csv(p):
        if not p or not Path(p).is_file():
            return None
        try:
            return pd.read_csv(p)
        except pd.errors.EmptyDataError:
            return pd.DataFrame()

    return Inputs(
        js(acceptance), js(speculate), js(online), csv(train_metrics), csv(validate), js(baselines)
    )


# ---------------------------------------------------------------------------------------------
# numbers and the verdict


def _pct(x) -> str:
    return "n/a" if x is None or _nan(x) else f"{100 * x:.0f} %"


def _nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def shape_text(rec: dict) -> str:
    """How a decoding record drafted: "3 draft tokens" (a chain) or the tree's shape."""
    k, topk = rec.get("draft_tokens"), int(rec.get("topk") or 1)
    if topk == 1:
        return f"{k} draft tokens"
    return f"a tree of {k} steps × top-{topk}, {rec.get('verify_tokens')} tokens verified"


def speed(inp: Inputs) -> tuple[float | None, str, float | None, int | None]:
    """(speed-up over plain decoding, where it was measured, measured accept length, draft
    tokens), preferring SGLang's measurement."""
    o = inp.online or {}
    if o.get("status") == "ok" and o.get("speedup"):
        k = o.get("draft_tokens")
        mode = {"cuda_graph": "CUDA graphs", "eager": "eager"}.get(o.get("mode"), "eager")
        where = f"SGLang EAGLE-3, {shape_text(o)}, {mode}"
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


def verdict(inp: Inputs) -> str:
    """One line: speed ratio, acc_0, acc_1|0, extraction errors; loud when speculation loses."""
    ratio, where, measured, k = speed(inp)
    if measured is not None and not _nan(measured):
        where += f"; {measured:.2f} tokens/verify step"
    a = inp.acceptance or {}
    acc, cond = a.get("acc") or [], a.get("cond_acc") or []
    if ratio is None:
        parts = ["speculation speed not measured"]
    elif ratio < 1.0:
        parts = [f"**SPECULATION IS SLOWER THAN PLAIN DECODING: {ratio:.2f}×** ({where})"]
    else:
        parts = [f"speculation {ratio:.2f}× plain decoding ({where})"]
    accs = [f"acc_0 {_pct(acc[0] if acc else None)}"]
    b = inp.baselines or {}
    if acc and b.get("probe"):  # the drafter's step-0 inputs without attention over the context
        probe = b["probe"]
        accs[0] += (
            f" ({probe.get('epochs', '?')}-epoch probe {_pct(probe['acc'])}, "
            f"bigram {_pct(b.get('bigram_acc'))})"
        )
    if len(cond) > 1:
        accs.append(f"acc_1|0 {_pct(cond[1])}")
    taus = a.get("tau_by_draft_tokens") or []
    if taus:  # offline tokens per verify step, at the measured number of drafts when scored
        K = k if k and k <= len(taus) else len(taus)
        walk = a.get("walk_accept_length_by_draft_tokens") or []
        if len(walk) >= K:  # what decoding the held-out answers would emit per verify step
            accs.append(
                f"offline {walk[K - 1]:.2f} tokens/verify step for a chain of {K} drafts "
                "(decoding walk; "
                f"τ+1 {taus[K - 1] + 1:.2f})"
            )
        else:
            accs.append(f"offline {taus[K - 1] + 1:.2f} tokens/verify step, chain of {K} drafts")
    parts.append(", ".join(accs))
    errors = extraction_errors(inp)
    parts.append("extraction errors unknown" if errors is None else f"{errors} extraction errors")
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------
# figures


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    """Write the figure atomically, in the format its name asks for (.png by default)."""
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=120, bbox_inches="tight", format=path.suffix[1:] or "png")
    finally:
        _plt().close(fig)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _acceptance_figure(inp: Inputs, figsize, key: str):
    """(fig, ax, inp.acceptance), or with None for it when it lacks ``key`` (the axes say so)."""
    fig, ax = _plt().subplots(figsize=figsize)
    a = inp.acceptance
    if not a or not a.get(key):
        _empty(ax, "offline acceptance not measured")
        return fig, ax, None
    return fig, ax, a


def fig_acceptance(inp: Inputs, path: Path) -> None:
    fig, ax, a = _acceptance_figure(inp, (7.5, 4.2), "acc")
    if a is not None:
        K = len(a["acc"])
        x = list(range(K))
        w = 0.27
        series = [
            ("acc_k (every scored row)", a["acc"], -w),
            ("conditional: acc_k | drafts 0..k-1 accepted", a["cond_acc"], 0.0),
            ("chain: drafts 0..k all accepted", a["chain"], w),
        ]
        for label, ys, dx in series:
            ys = [100 * (0 if _nan(y) else y) for y in ys]
            bars = ax.bar([i + dx for i in x], ys, width=w, label=label)
            ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=1)
        ax.set_xticks(x, [f"{k}" for k in x])
        ax.set_xlabel("draft position k (0 = first draft token)")
        ax.set_ylabel("acceptance (%)")
        ax.set_ylim(0, 105)
        ax.legend(fontsize=8, loc="upper right")
        ax.grid(axis="y", alpha=0.3)
    ax.set_title("Offline acceptance per draft position (held-out stores, greedy target)")
    _save(fig, path)


def fig_tau(inp: Inputs, path: Path) -> None:
    fig, ax, a = _acceptance_figure(inp, (7, 4.2), "tau_by_draft_tokens")
    if a is not None:
        taus = a["tau_by_draft_tokens"]
        ks = list(range(1, len(taus) + 1))
        ax.plot(ks, [t + 1 for t in taus], "o-", label="τ + 1: tokens per verify step (offline)")
        ax.plot(ks, taus, "s--", label="τ: accepted drafts per verify step (offline)")
        walk = a.get("walk_accept_length_by_draft_tokens") or []
        if len(walk) == len(ks):
            ax.plot(ks, walk, "^-", label="decoding walk: tokens per verify step (offline)")
        ax.plot(ks, [k + 1 for k in ks], ":", color="gray", label="ceiling: every draft accepted")
        s = inp.speculate or {}
        if s.get("accept_length") and not _nan(s["accept_length"]):
            ax.plot(
                [s["draft_tokens"]], [s["accept_length"]], "*", ms=14, color="C3",
                label=f"measured, transformers loop, {shape_text(s)} ({s['accept_length']:.2f})",
            )  # fmt: skip
        o = inp.online or {}
        if o.get("status") == "ok" and o.get("accept_length"):
            ax.plot(
                [o["draft_tokens"]], [o["accept_length"]], "D", ms=9, color="C2",
                label=f"measured, SGLang, {shape_text(o)} ({o['accept_length']:.2f})",
            )  # fmt: skip
        ax.set_xticks(ks)
        ax.set_xlabel("draft tokens per verify step (K; a tree: its steps)")
        ax.set_ylabel("tokens per verify step")
        ax.set_ylim(0, max(ks) + 1.5)
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(alpha=0.3)
    ax.set_title("Expected acceptance length τ against chain length")
    _save(fig, path)


def fig_training(inp: Inputs, path: Path) -> None:
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    df = inp.train_metrics
    if df is None or df.empty or "step" not in df:
        _empty(ax1, "no training metrics")
        _empty(ax2, "no training metrics")
    else:
        w = max(1, len(df) // 25)  # per-batch values are noisy: a rolling mean of w steps
        smooth = df.rolling(w, min_periods=1).mean(numeric_only=True)
        ax1.plot(df["step"], smooth["loss"], color="black", lw=1.5, label="weighted total")
        for c in sorted((c for c in df if c.startswith("loss_")), key=lambda c: int(c[5:])):
            ax1.plot(df["step"], smooth[c], lw=0.8, alpha=0.8, label=f"step {c[5:]}")
        ax1.set_ylabel("soft cross-entropy (nats)")
        ax1.set_title("Training loss per unroll step")
        for c in sorted((c for c in df if c.startswith("acc_")), key=lambda c: int(c[4:])):
            ax2.plot(df["step"], 100 * smooth[c], lw=1, label=f"acc_{c[4:]}")
        ax2.set_ylabel("draft = target greedy (%)")
        ax2.set_ylim(0, 100)
        ax2.set_title("Training accuracy per unroll step (train batches)")
        for ax in (ax1, ax2):
            ax.set_xlabel("optimizer step" + (f" (rolling mean of {w} steps)" if w > 1 else ""))
            ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
            ax.legend(fontsize=7, ncol=2)
            ax.grid(alpha=0.3)
    _save(fig, path)


def fig_extraction(inp: Inputs, path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    df = inp.validate
    if df is None or df.empty or "split" not in df:
        for ax in axes:
            _empty(ax, "no validation summary")
    else:
        shards = df[df["split"].astype(str) != "all"]
        labels = [f"{s}/{h}" for s, h in zip(shards["split"], shards["shard"], strict=True)]
        x = range(len(labels))
        cols = [
            ("tokens", 1.0, "tokens", "Tokens per shard"),
            ("bytes_stored", 1 / 2**20, "stored (MiB)", "Bytes on disk per shard"),
            ("errors", 1.0, "errors", "Extraction/validation errors"),
        ]
        for ax, (col, scale, ylabel, title) in zip(axes, cols, strict=True):
            vals = shards[col].fillna(0).astype(float) * scale if col in shards else [0] * len(x)
            color = "C3" if col == "errors" and sum(vals) > 0 else "C0"
            bars = ax.bar(list(x), list(vals), color=color)
            ax.bar_label(bars, fmt="%.0f" if col != "bytes_stored" else "%.1f", fontsize=7)
            ax.set_xticks(list(x), labels, rotation=30, ha="right", fontsize=8)
            ax.set_xlabel("split/shard")
            ax.set_ylabel(ylabel)
            ax.set_title(title)
            if col == "errors":
                ax.set_ylim(0, max(1.0, max(vals, default=0) * 1.2))
    fig.suptitle(f"Hidden-state extraction: {_extraction_line(inp)}", fontsize=10)
    fig.tight_layout()
    _save(fig, path)


def _extraction_line(inp: Inputs) -> str:
    df = inp.validate
    if df is None or df.empty or "split" not in df:
        return "no summary"
    total = df[df["split"].astype(str) == "all"]
    row = total.iloc[-1] if len(total) else df.sum(numeric_only=True)
    tokens, nbytes = int(row.get("tokens", 0)), float(row.get("bytes_stored", 0))
    errors = extraction_errors(inp)
    return f"{tokens:,} tokens, {nbytes / 2**20:.1f} MiB, {errors} errors"


def fig_speed(inp: Inputs, path: Path) -> None:
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    bars = []
    s, o = inp.speculate or {}, inp.online or {}
    if s.get("plain_tokens_per_s"):
        dev = s.get("device", "?")
        bars += [(f"plain\n(transformers, {dev})", s["plain_tokens_per_s"], "C7")]
        bars += [(f"speculative\n(transformers, {dev})", s["spec_tokens_per_s"], "C0")]
    if o.get("status") == "ok":
        bars += [("plain\n(SGLang)", o["plain_tokens_per_s"], "C7")]
        bars += [("EAGLE-3\n(SGLang)", o["spec_tokens_per_s"], "C2")]
    if bars:
        b = ax1.bar(range(len(bars)), [v for _, v, _ in bars], color=[c for *_, c in bars])
        ax1.bar_label(b, fmt="%.0f", fontsize=8)
        ax1.set_xticks(range(len(bars)), [n for n, *_ in bars], fontsize=8)
        ax1.set_ylabel("new tokens per second (batch 1, greedy)")
        ratio = speed(inp)[0]
        ax1.set_title(f"Decoding speed\nspeculation {ratio:.2f}× plain decoding")
        ax1.grid(axis="y", alpha=0.3)
    else:
        _empty(ax1, "speed not measured")
        ax1.set_title("Decoding speed")
    hist = s.get("accept_histogram")
    if hist and sum(hist):
        total = sum(hist)
        b = ax2.bar(range(len(hist)), [100 * h / total for h in hist], color="C0")
        ax2.bar_label(b, fmt="%.0f", fontsize=8)
        ax2.set_xticks(range(len(hist)))
        ax2.set_xlabel("drafts accepted in a verify step (bonus token not counted)")
        ax2.set_ylabel("verify steps (%)")
        ax2.set_title(
            "Drafts accepted per verify step (transformers loop)\n"
            f"mean accept length {s['accept_length']:.2f} tokens/step, bonus token included"
        )
        ax2.grid(axis="y", alpha=0.3)
    else:
        _empty(ax2, "no speculative decoding steps")
    _save(fig, path)


# ---------------------------------------------------------------------------------------------
# the summary


def _fmt(x, spec: str = ".2f") -> str:
    if x is None or _nan(x):
        return "-"
    return format(x, spec)


def summary_markdown(inp: Inputs, figures: dict[str, Path] | None = None) -> str:
    lines = [verdict(inp), "", "# Eyrie run report", ""]
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
        lines += [
            "",
            "τ: expected drafts accepted per verify step (no bonus token, SpecForge's simulated "
            "length); τ+1 adds the target's own token. Decoding walk: the held-out answers "
            "decoded verify step by verify step (each starts where the last one ended), tokens "
            "emitted per step: what the transformers loop and SGLang's accept length measure; "
            "below τ+1 where acceptance comes in runs.",
            "",
        ]
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
            f"{s.get('identical')}/{s.get('prompts')} prompts",
        ]
    else:
        lines.append("- transformers loop: not run")
    o = inp.online
    if o and o.get("status") == "ok":
        for mode, m in (o.get("modes") or {o.get("mode", "eager"): o}).items():
            shown = {"cuda_graph": "CUDA graphs", "eager": "eager, --disable-cuda-graph"}
            lines.append(
                f"- SGLang online ({shown.get(mode, mode)}): plain "
                f"{_fmt(m.get('plain_tokens_per_s'), '.1f')} tok/s, EAGLE-3 "
                f"{_fmt(m.get('spec_tokens_per_s'), '.1f')} tok/s, **{_fmt(m.get('speedup'))}×**; "
                f"spec_accept_length {_fmt(m.get('accept_length'))}; identical outputs "
                f"{m.get('identical')}/{m.get('prompts')}"
            )
    else:
        reason = (o or {}).get("reason", "no record")
        lines.append(f"- SGLang online: not run: {reason}")
    lines += ["", "## Extraction", "", f"- {_extraction_line(inp)}"]
    df = inp.train_metrics
    if df is not None and not df.empty and "step" in df:
        last = df.iloc[-1]
        accs = ", ".join(
            f"{c} {_pct(last[c])}" for c in df if c.startswith("acc_") and c[4:].isdigit()
        )
        lines += ["", "## Training", "", f"- {int(last['step'])} steps; last batch: {accs}"]
    if figures:
        lines += ["", "## Figures", ""]
        lines += [f"- [{name}]({Path(p).name})" for name, p in figures.items()]
    return "\n".join(lines) + "\n"


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
    lines = [
        f"## Drafter vs baselines (step 0, {b['scored_heldout']} held-out rows, same rows)",
        "",
        "| predictor of the target's greedy token at t+1 | held-out acc |",
        "|---|---|",
    ]
    lines += [f"| {name} | {_pct(x)} |" for name, x in rows]
    probe = (b.get("probe") or {}).get("acc")
    if acc0 is not None and probe is not None and acc0 <= probe:
        lines += ["", "**The drafter does not beat a probe without context on its own inputs.**"]
    return lines + [""]


def build_report(inp: Inputs, out_dir, figures: dict[str, Path] | None = None) -> dict:
    """Write the figures and summary.md; returns {name: path} of everything written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = dict(figures or {name: out_dir / f"{name}.png" for name in FIGURES})
    draw = {
        "acceptance": fig_acceptance,
        "tau": fig_tau,
        "training": fig_training,
        "extraction": fig_extraction,
        "speed": fig_speed,
    }
    for name, path in figures.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        draw[name](inp, Path(path))
    summary = out_dir / "summary.md"
    write_text(summary, summary_markdown(inp, figures))
    return {"summary": summary, **figures}
