"""The one frame of every Snakemake script adapter: its log, its thread count, its errors.

A rule's script calls `with rule_log(snakemake) as log:` and then the stage's function. All the
job's output goes to the rule's `log:` file; an EyrieError (a bad input, named with its fix) is
written there and ends the job with that one message instead of a traceback, and so does a full
disk, wherever in the stage it happens (the message names the file, or else the job's first
output, and the space free there); any other exception keeps its traceback for a bug report.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TextIO

from eyrie.common.disk_full import describe, is_disk_full
from eyrie.common.errors import EyrieError


@contextlib.contextmanager
def rule_log(sm, *, threads: bool = True) -> Iterator[TextIO]:
    """Send stdout, stderr and logging to the rule's log; an EyrieError ends the job cleanly.

    With `threads`, torch uses the rule's thread count (the cores Snakemake granted the job).
    """
    if threads:
        import torch

        torch.set_num_threads(max(1, int(sm.threads)))
    error = None
    try:
        with open(sm.log[0], "w") as log, contextlib.redirect_stdout(log):
            with contextlib.redirect_stderr(log):
                logging.basicConfig(
                    stream=log, level=logging.INFO, format="%(levelname)s %(message)s", force=True
                )
                try:
                    yield log
                except Exception as exc:
                    if is_disk_full(exc):
                        error = describe(exc, fallback=_first_output(sm))
                    elif isinstance(exc, EyrieError):
                        error = str(exc)
                    else:
                        raise
                    # The log may sit on the full disk too: the message must still reach stderr.
                    with contextlib.suppress(OSError):
                        print(f"error: {error}", flush=True)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        error = error or describe(exc, fallback=sm.log[0])  # the log's own writes failed
    if error is not None:
        raise SystemExit(f"error: {error}")


def _first_output(sm) -> str | None:
    outputs = list(getattr(sm, "output", None) or [])
    return str(outputs[0]) if outputs else None
