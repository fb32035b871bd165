"""Progress of long jobs reaches their logs: a line every few seconds, not a bar redrawn in
place (eyrie.common.progress), and every stage's Snakemake adapter asks for it."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from eyrie.common import progress

ROOT = Path(__file__).resolve().parents[1]


def test_in_a_log_each_refresh_is_a_line_of_its_own(monkeypatch):
    monkeypatch.setattr(progress, "LOG_INTERVAL_S", 0.0)
    log = io.StringIO()
    bar = progress.bar(total=4, desc="extract train/000", unit="sample", file=log)
    for _ in range(4):
        bar.update(1)
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    counts = [re.search(r"\d/4", line).group() for line in lines]
    assert sorted(set(counts)) == ["0/4", "1/4", "2/4", "3/4", "4/4"]  # each update shown
    assert counts[-1] == "4/4"
    assert all(line.startswith("extract train/000:") for line in lines)


def test_in_a_log_lines_come_at_most_every_log_interval(monkeypatch):
    monkeypatch.setattr(progress, "LOG_INTERVAL_S", 3600.0)
    log = io.StringIO()
    bar = progress.bar(total=1000, desc="train", unit="step", file=log)
    for _ in range(1000):
        bar.update(1)
    bar.close()
    assert len(log.getvalue().splitlines()) == 2  # the start, then the end at close


def test_on_a_terminal_it_is_tqdms_own_bar():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    bar = progress.bar(total=2, desc="x", unit="step", file=out)
    bar.update(2)
    bar.close()
    assert "\r" in out.getvalue()


ADAPTERS = ["regenerate", "train_drafter", "evaluate_acceptance", "speculate", "validate_shard",
            "evaluate_baselines"]  # fmt: skip


@pytest.mark.parametrize("name", ADAPTERS)
def test_each_long_jobs_adapter_sends_progress_to_its_log(name):
    text = (ROOT / "scripts" / f"{name}.py").read_text()
    assert "progress=True" in text
    assert "progress=False" not in text and "--no-progress" not in text
