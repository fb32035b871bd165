"""The run's report: figures, summary.md (its first line the verdict) and the HTML report's
landing page.

`snakemake --report` opens on the workflow description (report/workflow.rst), which includes
the landing page this module writes (report/landing.rst under the results folder): the verdict,
the acceptance per draft position and the speed-up table, readable without a click. The text
is eyrie.evaluate.summary's, the figures eyrie.evaluate.figures'.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from eyrie.common.atomic import write_text
from eyrie.common.layout import SPLITS, Layout
from eyrie.data.problems import read_skipped
from eyrie.evaluate import figures as fig
from eyrie.evaluate.summary import (
    Inputs,
    _fmt,
    key_numbers,
    method_text,
    read_inputs,
    summary_markdown,
    verdict,
)

__all__ = ["FIGURES", "Inputs", "build_report", "read_inputs", "summary_markdown", "verdict"]

FIGURES = ("acceptance", "tau", "training", "extraction", "speed")
LANDING = "landing.rst"  # beside summary.md; report/workflow.rst includes it
_DRAW = {
    "acceptance": fig.fig_acceptance,
    "tau": fig.fig_tau,
    "training": fig.fig_training,
    "extraction": fig.fig_extraction,
    "speed": fig.fig_speed,
}


def build_report(inp: Inputs, out_dir, figures: dict[str, Path] | None = None) -> dict:
    """Write the figures, summary.md and landing.rst; returns {name: path} of all written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = dict(figures or {name: out_dir / f"{name}.png" for name in FIGURES})
    for name, path in figures.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        _DRAW[name](inp, Path(path))
    summary = out_dir / "summary.md"
    write_text(summary, summary_markdown(inp, figures))
    landing = out_dir / LANDING
    write_text(landing, landing_rst(inp, figures.get("acceptance")))
    return {"summary": summary, "landing": landing, **figures}


# ---------------------------------------------------------------------------------------------
# the HTML report's landing page


def _html(markdown: str) -> str:
    """One line of the summary's Markdown as HTML (escaped; **bold** kept)."""
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html.escape(markdown, quote=False))


def speed_rows(inp: Inputs) -> list[list[str]]:
    """The speed-up table: one row per decoding measured (transformers loop, SGLang modes)."""
    rows = []
    s = inp.speculate
    if s and s.get("plain_tokens_per_s"):
        rows.append(
            [f"transformers loop, {s.get('device', '?')}"]
            + _speed_cells(s, s.get("identical"), s.get("prompts"))
        )
    o = inp.online or {}
    if o.get("status") == "ok":
        for mode, m in (o.get("modes") or {o.get("mode", "eager"): o}).items():
            shown = {"cuda_graph": "CUDA graphs"}.get(mode, mode)
            for d in m.get("settings") or [m]:
                cells = _speed_cells({**m, **d}, d.get("identical"), m.get("prompts"))
                name = f"SGLang {method_text(d)} {d.get('setting', '')}, {shown}"
                rows.append([name.replace(" ,", ",")] + cells)
    return rows


def _speed_cells(rec: dict, identical, prompts) -> list[str]:
    return [
        _fmt(rec.get("plain_tokens_per_s"), ".1f"),
        _fmt(rec.get("spec_tokens_per_s"), ".1f"),
        f"{_fmt(rec.get('speedup'))}×",
        _fmt(rec.get("accept_length")),
        f"{identical}/{prompts}",
    ]


SPEED_HEADER = ["decoding", "plain tok/s", "speculative tok/s", "speed-up", "tokens/verify step",
                "same output as plain"]  # fmt: skip


# Snakemake's report centres its landing page vertically, which cuts off the top (the verdict)
# in a window shorter than the page; this starts it at the top instead.
_TOP = "<style>.h-screen.overflow-auto.items-center { align-items: flex-start; }</style>"


def landing_rst(inp: Inputs, acceptance_png: Path | None) -> str:
    """The landing page as reStructuredText (one raw HTML block: the summary's own wording,
    untouched by reST's markup), short enough for one screen: the verdict, the numbers under
    it (explained in summary.md), the skipped dataset lines when there are any, the acceptance
    figure (embedded, so the one-file report needs nothing else) and the speed-up table."""
    parts = [_TOP, f"<p><strong>Verdict</strong>: {_html(verdict(inp))}</p>"]
    numbers = [line.removeprefix("- ").split(": ", 1)[0] for line in key_numbers(inp)]
    if numbers:
        parts.append(
            f"<p>{_html('; '.join(numbers))} (each explained in 1. Verdict, summary.md)</p>"
        )
    skipped = [s for s in inp.dataset if s.bad]
    if skipped:
        items = "".join(f"<li>{_html(s.line())}</li>" for s in skipped)
        parts.append(f"<p><strong>Dataset lines skipped</strong>:</p><ul>{items}</ul>")
    if acceptance_png is not None and Path(acceptance_png).is_file():
        # docutils refuses lines over 10,000 characters; a URL may be split over lines (its
        # parser drops tabs and newlines), so the image's base64 comes 76 characters a line
        data = base64.encodebytes(Path(acceptance_png).read_bytes()).decode("ascii")
        lines = "\n".join(data.split())
        parts.append(
            f'<img alt="offline acceptance per draft position" style="width:100%" '
            f'src="data:image/png;base64,\n{lines}">'
        )
    rows = speed_rows(inp)
    if rows:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in SPEED_HEADER)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
        )
        parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    text = "\n".join(parts)
    return ".. raw:: html\n\n" + "".join(f"   {line}\n" for line in text.splitlines())


# ---------------------------------------------------------------------------------------------
# the console at the end of a run


def run_end_text(results) -> str:
    """What the Snakefile's onsuccess prints: the verdict (summary.md's first line, when the
    report was written) and every split's skipped dataset lines with the table to read."""
    layout = Layout(Path(results))
    lines = []
    summary = layout.report_dir() / "summary.md"
    if summary.is_file():
        first = summary.read_text(encoding="utf-8").splitlines()[:1]
        lines.append(f"Eyrie verdict ({summary}): {first[0] if first else 'empty'}")
    tables = [layout.problems(split) for split in SPLITS]
    skipped = [s for s in map(read_skipped, tables) if s is not None]
    if skipped:
        lines.append("Eyrie dataset lines skipped (rule prepare_dataset):")
        lines += [f"  {s.line()}" for s in skipped]
    return "\n".join(lines)
