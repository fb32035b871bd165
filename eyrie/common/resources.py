"""What each workflow job asks a cluster for, from the config's `resources` section.

Site specifics (partition, account, GPU model, memory, time) live in one config section, not in
the rules: rules/resources.smk applies `requests(config, rule)` to every rule by name, so rules
added later get requests too. Whether a rule's jobs need GPUs is the rule's own knowledge: it
declares `gpu=N` in its `resources:` (rules/*.smk), N from the config (0: its jobs run on the
CPU). Precedence, lowest first: `resources.default`, what the rule declares itself,
`resources.gpu` (GPU jobs only), `resources.rules[NAME]`; snakemake's `--set-resources` still
wins over all. The returned names are the standard ones snakemake's
SLURM executor turns into sbatch flags (docs/cluster.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from eyrie.common.errors import EyrieError

# config key -> snakemake resource (what the SLURM executor reads; sbatch flag in the comment)
RESOURCE_NAMES = {
    "gpu": "gpu",  # --gpus=N, or --gpus=MODEL:N with gpu_model
    "gpu_model": "gpu_model",
    "cpus": "cpus_per_task",  # -c; unset: the rule's threads
    "mem_mb": "mem_mb",  # --mem
    "runtime": "runtime",  # -t, minutes
    "partition": "slurm_partition",  # -p
    "account": "slurm_account",  # -A
    "extra": "slurm_extra",  # appended verbatim, e.g. "--qos=high --constraint=h200"
}


class ResourcesError(EyrieError, ValueError):
    """A resources section that names a rule the workflow does not have."""


def check_rule_names(config: dict, rules: Iterable[str]) -> None:
    """Fail on a resources.rules entry that matches no rule (a typo would be silently ignored)."""
    named = set(config.get("resources", {}).get("rules") or {})
    unknown = sorted(named - set(rules))
    if unknown:
        raise ResourcesError(
            f"config resources.rules names unknown rule(s) {unknown}; "
            f"the workflow's rules are {sorted(set(rules))}"
        )


def _named(level: dict) -> dict:
    """A config level in snakemake's resource names, null and empty keys left out."""
    return {RESOURCE_NAMES[k]: v for k, v in level.items() if v is not None and v != ""}


def requests(config: dict, rule: str, declared: dict | None = None) -> dict:
    """The snakemake resources for one rule's jobs.

    Levels, lowest first: resources.default; what the rule declares itself (`declared`, in
    snakemake names); resources.gpu for GPU jobs; resources.rules[NAME]. A null key inherits,
    and a key no level sets is not requested. A rule is a GPU job when it declares gpu > 0,
    unless resources.rules[NAME].gpu says otherwise (0: off, N > 0: on); its GPUs are the
    declared count, or resources.default.gpu when larger.
    """
    section = config.get("resources") or {}
    own = (section.get("rules") or {}).get(rule) or {}
    declared = {k: v for k, v in (declared or {}).items() if k in RESOURCE_NAMES.values()}
    gpus = declared.pop("gpu", None)
    gpu_job = own["gpu"] > 0 if own.get("gpu") is not None else bool(gpus)
    merged = _named(section.get("default") or {})
    merged.update({k: v for k, v in declared.items() if v is not None})
    if gpu_job:
        floor = int(merged.get("gpu") or 0)
        merged["gpu"] = gpus if callable(gpus) else max(int(gpus or 1), floor)
        merged.update(_named(section.get("gpu") or {}))
    merged.update(_named(own))
    if not gpu_job or not merged.get("gpu"):
        merged["gpu"] = 0
        merged.pop("gpu_model", None)
    return merged


def declared(rule, default_resources) -> dict:
    """What a rule's own `resources:` set: every value not inherited from default-resources."""
    from snakemake.resources import Resources

    defaults = Resources.from_mapping(default_resources or Resources.default("bare"))
    return {
        name: res.raw
        for name, res in rule.resources.items()
        if not name.startswith("_") and (name not in defaults or defaults[name].raw != res.raw)
    }


def apply_to_rules(workflow, config: dict) -> None:
    """Give every rule of a parsed Snakefile its requests; --set-resources keeps the last word.

    Uses snakemake's Rule.resources (a snakemake.resources.Resources mapping), so it must run
    after the last rule is defined: rules/resources.smk is the Snakefile's last include.
    """
    from snakemake.resources import Resources

    settings = workflow.resource_settings
    check_rule_names(config, [r.name for r in workflow.rules])
    for rule in workflow.rules:
        wanted = requests(config, rule.name, declared(rule, settings.default_resources))
        rule.resources.update(Resources.from_mapping(wanted))
        rule.resources.update(
            Resources.from_mapping(settings.overwrite_resources.get(rule.name, {}))
        )
