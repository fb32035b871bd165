"""The one frame of every Snakemake script adapter: its log, its thread count, its errors.

A rule's script calls `with rule_log(snakemake) as log:` and then the stage's function. All the
job's output goes to the rule's `log:` file; an EyrieError (a bad input, named with its fix) is
written there and ends the job with that one message instead of a traceback, while any other
exception keeps its traceback for a bug report.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TextIO

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
    with open(sm.log[0], "w") as log, contextlib.redirect_stdout(log):
        with contextlib.redirect_stderr(log):
            logging.basicConfig(
                stream=log, level=logging.INFO, format="%(levelname)s %(message)s", force=True
            )
            try:
                yield log
            except EyrieError as exc:
                error = exc
                print(f"error: {exc}")
    if error is not None:
        raise SystemExit(f"error: {error}")
