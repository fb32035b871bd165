"""Progress bars that also work in a job's log file.

On a terminal a bar is tqdm's usual one, redrawn in place. A Snakemake job's stdout and stderr
go to its log file (eyrie.common.adapter.rule_log), where redrawing with carriage returns would
leave one endless line that `tail -f` and `less` show badly; there each refresh is a line of its
own, written every `log_interval` seconds, so the log says how far a long job is and how long
it has left.
"""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm

LOG_INTERVAL_S = 5.0  # a log line every few seconds: often enough to watch, few enough to read


class _Lines:
    """A stream for tqdm that writes each status as a line instead of redrawing it."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self._last = ""

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()  # tqdm writes "\r" + status, then "\n" at close
        if line and line != self._last:
            self.stream.write(line + "\n")
            self._last = line

    def flush(self) -> None:
        self.stream.flush()


def _is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def bar(
    *,
    total: int | None,
    desc: str,
    unit: str,
    initial: int = 0,
    disable: bool = False,
    file: TextIO | None = None,
    log_interval: float | None = None,
    **kwargs,
) -> tqdm:
    """A tqdm bar on `file` (default: stderr as it is now, i.e. the job's log inside a rule).

    The rate and ETA are averages over the whole run (smoothing 0): a job whose steps vary in
    length (a batch of long prompts, a checkpoint) then keeps a steady estimate. `miniters` 0
    lets `update(0)` refresh a postfix between steps (eyrie/regenerate: tokens between turns).
    """
    stream = file if file is not None else sys.stderr
    tty_interval = kwargs.pop("mininterval", 0.5)
    if _is_tty(stream):
        out, interval = stream, tty_interval
    else:
        out = _Lines(stream)
        interval = LOG_INTERVAL_S if log_interval is None else log_interval
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit=unit,
        disable=disable,
        file=out,
        mininterval=interval,
        miniters=0,
        smoothing=0,
        dynamic_ncols=False,
        **kwargs,
    )
