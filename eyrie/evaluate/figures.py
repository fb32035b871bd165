"""The report's figures, each from the run's records (eyrie.evaluate.summary.Inputs); an input
that is missing gives axes that say so rather than no figure."""

from __future__ import annotations

from pathlib import Path

from eyrie.common.atomic import atomic_path
from eyrie.evaluate.summary import Inputs, _nan, extraction_line, method_text, shape_text, speed


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
    fig.suptitle(f"Hidden-state extraction: {extraction_line(inp)}", fontsize=10)
    fig.tight_layout()
    _save(fig, path)


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
        bars += [(f"{method_text(o)}\n(SGLang)", o["spec_tokens_per_s"], "C2")]
    if bars:
        b = ax1.bar(range(len(bars)), [v for _, v, _ in bars], color=[c for *_, c in bars])
        ax1.bar_label(b, fmt="%.0f", fontsize=8)
        ax1.set_xticks(range(len(bars)), [n for n, *_ in bars], fontsize=8)
        ax1.set_ylabel("new tokens per second (batch 1, greedy)")
        ratio = speed(inp)[0]
        than = "faster than plain decoding" if ratio >= 1 else "plain decoding: SLOWER"
        ax1.set_title(f"Decoding speed\nspeculation {ratio:.2f}× {than}")
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
