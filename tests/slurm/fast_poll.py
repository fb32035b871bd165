"""Snakemake, with the SLURM executor's status queries at most POLL_S apart: run as
`python tests/slurm/fast_poll.py ARGS...` in place of `python -m snakemake ARGS...`.

snakemake-executor-plugin-slurm 2.x waits 10 s longer after each query that finds no job
finished (up to 180 s), which on a real cluster spares the scheduler. On the test cluster a job
takes seconds, so each step of the DAG waited up to ~20 s for the query that saw it end: about
half of tests/test_slurm.py's workflow time. Only the wait between queries changes: what is
submitted, what SLURM is asked for, how jobs run (python -m snakemake in each job) and how
their states are read are the plugin's own.
"""

from __future__ import annotations

import sys

import snakemake_executor_plugin_slurm as slurm
from snakemake.cli import main
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

POLL_S = 1

_interval = RemoteExecutor.next_seconds_between_status_checks


def _capped(self, seconds):
    _interval.fset(self, seconds if seconds is None else min(seconds, POLL_S))


slurm.Executor.next_seconds_between_status_checks = property(_interval.fget, _capped)

if __name__ == "__main__":
    sys.argv[0] = "snakemake"
    main()
