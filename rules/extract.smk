# Extract stage: the target's hidden states for every (split, shard), one shard store per job.
#
# Resume after a kill: Snakemake deletes a job's directory() output before it reruns the job, so
# the job writes into {R}/store/{split}/.work/ (not an output) and moves the finished store into
# place at the very end. `snakemake --rerun-incomplete` then resumes the scratch store from its
# last commit instead of starting the shard again.


rule extract:
    input:
        data=f"{R}/data/{{split}}.jsonl",
        target=target_config(),
        verify=f"{R}/verify/report.json",
        patch=PATCH_INPUTS,  # the SGLang patch bundle (rules/patch.smk); none for hf
    output:
        store=directory(f"{R}/store/{{split}}/shard-{{shard}}.zarr"),
        errors=f"{R}/store/{{split}}/shard-{{shard}}.errors.csv",
    params:
        target=lambda wildcards, input: os.path.dirname(input.target),
        architecture=config["target"]["architecture"],
        capture=EXTRACT_CAPTURE,  # config["capture"], plus the bundle's folder for sglang
        extract=config["extract"],
        max_tokens=config["dataset"]["max_tokens"],
        weights_cache=f"{R}/store/.weights-sha256.json",
    threads: 1
    resources:
        mem_mb=8000,
        runtime=120,
    log:
        f"{R}/logs/extract/{{split}}/shard-{{shard}}.log",
    benchmark:
        f"{R}/benchmarks/extract/{{split}}/shard-{{shard}}.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/extract.py"
