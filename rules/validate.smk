# Validate stage: each shard store against its input, the store format and the target; then
# one summary table that fails the run past validate.max_errors; its advice prints commands
# with this run's own options (RERUN, rules/common.smk).


rule validate_shard:
    input:
        store=f"{R}/store/{{split}}/shard-{{shard}}.zarr",
        errors=f"{R}/store/{{split}}/shard-{{shard}}.errors.csv",
        data=split_data,
        target=target_config(),
        identity=TARGET_IDENTITY,
    output:
        report=f"{R}/validate/{{split}}/shard-{{shard}}.json",
    params:
        target=lambda wildcards, input: os.path.dirname(input.target),
        architecture=config["target"]["architecture"],
        capture=config["capture"],
        shards=config["extract"]["shards"],
        max_tokens=config["dataset"]["max_tokens"],
        validate=config["validate"],
    threads: 1
    resources:
        mem_mb=8000,
        runtime=60,
        # the spot checks re-run the target on capture.device; auto asks for no GPU (set
        # capture.device to cuda to get GPUs on a cluster)
        gpu=int(
            config["capture"]["device"] == "cuda"
            and config["validate"]["spot_check_samples"] > 0
        ),
    log:
        f"{R}/logs/validate/{{split}}/shard-{{shard}}.log",
    benchmark:
        f"{R}/benchmarks/validate/{{split}}/shard-{{shard}}.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/validate_shard.py"


rule validate_summary:
    input:
        reports=expand(f"{R}/validate/{{split}}/shard-{{shard}}.json", split=SPLITS, shard=SHARDS),
        stores=expand(f"{R}/store/{{split}}/shard-{{shard}}.zarr", split=SPLITS, shard=SHARDS),
        tables=error_tables("train") + error_tables("heldout"),
    output:
        csv=f"{R}/validate/summary.csv",
        md=f"{R}/validate/summary.md",
    params:
        max_errors=config["validate"]["max_errors"],
        allow_overlap=config["dataset"]["allow_overlap"],  # ids shared by the splits allowed
    log:
        f"{R}/logs/validate/summary.log",
    benchmark:
        f"{R}/benchmarks/validate/summary.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/validate_summary.py"
