"""What each workflow job asks a cluster for, from the config's `resources` section.

Site specifics (partition, account, GPU model, memory, time) live in one config section, not in
the rules: rules/resources.smk applies `requests(config, rule)` to every rule by name, so rules
added later get requests too. Precedence, lowest first: `resources.default`, what the rule
declares itself, `resources.gpu` (GPU jobs only), `resources.rules[NAME]`; snakemake's
`--set-resources` still wins over all. The returned names are the standard ones snakemake's
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


def uses_gpu(config: dict, rule: str) -> bool:
    """Whether a rule's jobs need a GPU under this config (before per-rule overrides).

    Extraction runs the target: on a GPU when capture.device is cuda or SGLang serves it.
    Validation re-runs the target for its spot checks on capture.device; there `auto` asks for
    nothing (set capture.device to cuda to get GPUs on a cluster). Training and evaluation
    (evaluate_*) ask for GPUs unless their own device is cpu; evaluate_sglang only when SGLang
    serves the target; evaluate_baselines never (it runs on the CPU). Regeneration when its
    device is cuda, or when its SGLang backend launches a server (not with a server's url).
    """
    capture = config.get("capture", {})
    on_cuda = capture.get("device") == "cuda"
    if rule == "extract":
        return on_cuda or capture.get("backend") == "sglang"
    if rule == "validate_shard":
        return on_cuda and config.get("validate", {}).get("spot_check_samples", 0) > 0
    if rule == "train_drafter":
        return config.get("train", {}).get("device") != "cpu"
    if rule == "regenerate":
        regen = config.get("regenerate", {})
        if regen.get("backend") == "sglang":
            return not (regen.get("sglang") or {}).get("url")
        return regen.get("device") == "cuda"
    if rule == "evaluate_sglang":  # without SGLang it only records "not run", on the spot
        return capture.get("backend") == "sglang"
    if rule == "evaluate_baselines":  # a count table and a small probe, on the CPU
        return False
    if rule == "evaluate" or rule.startswith("evaluate_"):
        return config.get("evaluate", {}).get("device") != "cpu"
    return False


def default_gpus(config: dict, rule: str) -> int:
    """GPUs of a GPU job unless the config says: training starts one process per GPU."""
    if rule == "train_drafter":
        return int(config.get("train", {}).get("processes") or 1)
    return 1


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
    and a key no level sets is not requested. A rule is a GPU job when uses_gpu() says so or it
    declares gpu > 0, unless resources.rules[NAME].gpu says otherwise (0: off, N > 0: on).
    """
    section = config.get("resources") or {}
    own = (section.get("rules") or {}).get(rule) or {}
    declared = {k: v for k, v in (declared or {}).items() if k in RESOURCE_NAMES.values()}
    if own.get("gpu") is not None:
        gpu_job = own["gpu"] > 0
    else:
        gpu_job = uses_gpu(config, rule) or bool(declared.get("gpu"))
    merged = _named(section.get("default") or {})
    merged.update({k: v for k, v in declared.items() if v is not None})
    if gpu_job:
        gpus = merged.get("gpu")
        merged["gpu"] = gpus if callable(gpus) else max(default_gpus(config, rule), int(gpus or 0))
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
