# Eyrie: from a served target LLM to a trained, validated EAGLE-3 drafter.
# Stages: data -> regenerate (optional) -> target -> verify_env -> patch_server (SGLang) ->
# extract -> validate -> draft_vocab -> train -> export -> evaluate -> report.

from snakemake.utils import min_version, validate

from eyrie.cli.config import check_config

min_version("9.0")


configfile: "config.yaml"


# Eyrie's own check first: every bad key at once, with the allowed keys or values, and nothing
# else (Snakemake's validate() would print the whole schema); then validate() fills defaults.
check_config(config)
validate(config, "eyrie/schemas/config.schema.yaml")


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/regenerate.smk"
include: "rules/target.smk"
include: "rules/verify.smk"
include: "rules/patch.smk"
include: "rules/extract.smk"
include: "rules/validate.smk"
include: "rules/train.smk"
include: "rules/evaluate.smk"


rule all:
    input:
        final_outputs(),
    default_target: True


# The run's end on the console: the verdict and each split's skipped dataset lines, with the
# table that lists them (otherwise only in the job logs and results/data/).
onsuccess:
    from eyrie.evaluate.report import run_end_text

    print(run_end_text(R))


# Keep last: gives every rule above its cluster requests from config["resources"].
include: "rules/resources.smk"
