"""The bill of a run before it runs: disk, jobs and GPU-hours (eyrie.plan.bill)."""
