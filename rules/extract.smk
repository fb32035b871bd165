# Extract stage: the target's hidden states for every (split, shard), one shard store per job.
#
# Resume after a kill: Snakemake deletes a job's directory() output before it reruns the job, so
# the job writes into {R}/store/{split}/.work/ (not an output) and moves the finished store into
# place at the very end. `snakemake --rerun-incomplete` then resumes the scratch store from its
# last commit instead of starting the shard again.
#
# A kill while Snakemake itself deletes an old store (before a rerun, e.g. --forcerun extract)
# happens before Snakemake marks the job incomplete, so --rerun-incomplete cannot see it.
# Snakemake deletes outputs in the order they are listed: the errors table (one unlink) goes
# first, so a half-deleted store always comes with a missing table, and the next run redoes
# the job for that missing output. The job itself replaces a store by renaming, never by a
# deletion a kill could cut short (eyrie.common.atomic.replace_folder). Rules that read stores
# also take their errors tables as input (error_tables() in rules/common.smk), and a store
# found half deleted is reported when the workflow is parsed (rules/common.smk).


rule extract:
    input:
        data=split_data,
        target=target_config(),
        identity=TARGET_IDENTITY,
        verify=f"{R}/verify/report.json",
        overlap=OVERLAP_CHECKED,  # no held-out sample is a train sample (rules/data.smk)
        patch=PATCH_INPUTS,  # the SGLang patch bundle (rules/patch.smk); none for hf
    output:
        errors=f"{R}/store/{{split}}/shard-{{shard}}.errors.csv",  # first: see above
        store=directory(f"{R}/store/{{split}}/shard-{{shard}}.zarr"),
    params:
        target=lambda wildcards, input: os.path.dirname(input.target),
        architecture=config["target"]["architecture"],
        capture=EXTRACT_CAPTURE,  # config["capture"], plus the bundle's folder for sglang
        extract=config["extract"],
        max_tokens=config["dataset"]["max_tokens"],
        weights_cache=SHA256_CACHE,  # the target's digests (rules/common.smk)
    threads: 1
    resources:
        mem_mb=8000,
        runtime=120,
        # the target runs on a GPU when capture.device is cuda or SGLang serves it
        gpu=int(config["capture"]["device"] == "cuda" or config["capture"]["backend"] == "sglang"),
    log:
        f"{R}/logs/extract/{{split}}/shard-{{shard}}.log",
    benchmark:
        f"{R}/benchmarks/extract/{{split}}/shard-{{shard}}.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/extract.py"
