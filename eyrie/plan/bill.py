"""The bill of a run before it runs: what its stores take on disk, how many jobs a cluster run
submits, and the GPU-hours of the stages whose rate was measured (eyrie/plan/rates.yaml).

Disk is exact arithmetic: each token stores len(aux) + 1 states (the aux layers' and the last
layer's) of ``hidden`` bf16 values, 2 bytes each; the store then keeps a measured share of that.
Jobs follow the config: one extract and one validate_shard job per split and shard, one
regenerate job per split when regeneration is on, one train_drafter job over
``train.processes`` GPUs. GPU-hours are tokens over one GPU's measured rate, per epoch for
training; a stage without a measured rate says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from eyrie.common.disk_full import human
from eyrie.common.errors import EyrieError

RATES = Path(__file__).with_name("rates.yaml")
SPLITS = ("train", "heldout")
BF16_BYTES = 2
DEFAULT_AUX = 3  # EAGLE-3's three aux layers when capture.aux_layer_ids is null


class PlanError(EyrieError, ValueError):
    """A bill cannot be made from what was given; the message names the missing input."""


@dataclass
class Bill:
    tokens: int
    hidden: int
    states: int  # stored per token: the aux layers' and the final layer's
    precision: str
    raw_bytes: int
    stored_bytes: float
    stored_over_raw: float
    jobs: dict[str, int]
    gpus: dict[str, int]
    gpu_hours: dict[str, float]
    sources: dict[str, str] = field(default_factory=dict)  # figure -> the run that measured it


def load_rates(path: Path = RATES) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def states_per_token(config: dict) -> int:
    aux = config["capture"]["aux_layer_ids"]
    return (len(aux) if aux else DEFAULT_AUX) + 1


def job_counts(config: dict) -> tuple[dict[str, int], dict[str, int]]:
    """(jobs per rule, GPUs per job) of the stages that scale with the data."""
    shards = int(config["extract"]["shards"])
    splits = len(SPLITS)
    jobs = {"extract": splits * shards, "validate_shard": splits * shards, "train_drafter": 1}
    if config["regenerate"]["enabled"]:
        jobs = {"regenerate": splits, **jobs}
    gpus = {name: 1 for name in jobs}
    gpus["train_drafter"] = int(config["train"]["processes"])
    return jobs, gpus


def make_bill(
    config: dict,
    *,
    hidden: int,
    tokens: int,
    rates: dict | None = None,
    extract_tok_s: float | None = None,
    train_tok_s: float | None = None,
) -> Bill:
    """The bill of ``tokens`` tokens of a target of width ``hidden`` under ``config`` (a
    validated config, defaults filled in)."""
    if hidden < 1 or tokens < 1:
        raise PlanError(f"hidden ({hidden}) and tokens ({tokens}) must be positive")
    rates = rates or load_rates()
    precision = config["extract"]["precision"]
    share = rates["stored_over_raw"].get(precision)
    if share is None:
        known = ", ".join(rates["stored_over_raw"])
        raise PlanError(f"no measured store size for extract.precision {precision!r} (measured: "
                        f"{known}); measure one store at it and add it to {RATES}")  # fmt: skip
    states = states_per_token(config)
    raw = tokens * states * hidden * BF16_BYTES
    jobs, gpus = job_counts(config)
    sources = {f"stored_over_raw {precision}": share["measured"]}
    hours = {}
    given = {"extract": extract_tok_s, "train": train_tok_s}
    passes = {"extract": 1, "train": int(config["train"]["epochs"])}
    for stage, rate in rates["tokens_per_s"].items():
        measured = f"{rate['value']} at width {rate['width']}: {rate['measured']}"
        if given[stage]:
            hours[stage] = tokens * passes[stage] / given[stage] / 3600
            sources[f"{stage} tokens/s"] = f"{given[stage]:g}, given on the command line"
        elif rate["width"] == hidden:
            hours[stage] = tokens * passes[stage] / rate["value"] / 3600
            sources[f"{stage} tokens/s"] = measured
        else:  # another width costs another rate: no figure rather than a wrong one
            sources[f"{stage} tokens/s"] = (
                f"not measured at width {hidden} (measured: {measured}); give --{stage}-tok-s"
            )
    return Bill(tokens, hidden, states, precision, raw, raw * share["value"], share["value"],
                jobs, gpus, hours, sources)  # fmt: skip


def render(bill: Bill) -> str:
    """The bill as Markdown, each figure with its formula and the runs it projects from."""
    lines = [
        f"# The bill: {bill.tokens:,} tokens at hidden {bill.hidden}",
        "",
        f"- raw states: tokens × {bill.states} states × {bill.hidden} × {BF16_BYTES} bytes = "
        f"**{human(bill.raw_bytes)}**",
        f"- stored ({bill.precision}): raw × {bill.stored_over_raw} = "
        f"**{human(bill.stored_bytes)}**",
        "",
        "| stage | jobs | GPUs a job | GPU-hours (all jobs) |",
        "|---|---|---|---|",
    ]
    stage_of = {"extract": "extract", "train_drafter": "train"}
    for name, n in bill.jobs.items():
        hours = bill.gpu_hours.get(stage_of.get(name, ""))
        shown = "not measured" if hours is None else f"{hours:,.1f}"
        lines.append(f"| {name} | {n} | {bill.gpus[name]} | {shown} |")
    lines += ["", "GPU-hours = tokens × passes (train.epochs for training) ÷ tokens/s of one GPU ÷ "
              "3600; projected from:", ""]  # fmt: skip
    lines += [f"- {what}: {source}" for what, source in bill.sources.items()]
    return "\n".join(lines) + "\n"
