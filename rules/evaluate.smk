# Evaluate stage: offline acceptance on the held-out stores, baselines on the same rows (bigram,
# per-position probe), speculative decoding in-process
# (transformers, this job's device), SGLang's own measurement (capture.backend sglang on a GPU;
# otherwise a "not run: <reason>" record), then the report (figures and summary.md).

from eyrie.evaluate.stage import evaluation_steps

EVAL = config["evaluate"]
ONLINE_SGLANG = config["capture"]["backend"] == "sglang"
REPORT_FIGURES = ["acceptance", "tau", "speed", "training", "extraction"]
# the exported SGLang drafter folder, when export.engines writes one and SGLang will serve it
SGLANG_DRAFT = (
    [f"{R}/export/sglang"]
    if ONLINE_SGLANG and "sglang" in config["export"]["engines"]
    else []
)


rule evaluate_acceptance:
    input:
        stores=expand(f"{R}/store/heldout/shard-{{shard}}.zarr", shard=SHARDS),
        tables=error_tables("heldout"),  # a half-deleted store is extracted again first
        drafter=f"{R}/train/drafter/model.safetensors",
        target=target_config(),
        identity=TARGET_IDENTITY,
    output:
        json=f"{R}/evaluate/acceptance.json",
        csv=f"{R}/evaluate/acceptance.csv",
    params:
        drafter=lambda wildcards, input: os.path.dirname(input.drafter),
        target=lambda wildcards, input: os.path.dirname(input.target),
        steps=evaluation_steps(EVAL["steps"], config["train"]["ttt_steps"]),
        batch_size=EVAL["batch_size"],
        max_len=config["train"]["max_len"],
        device=EVAL["device"],
    threads: 2
    resources:
        gpu=int(EVAL["device"] != "cpu"),
    log:
        f"{R}/logs/evaluate/acceptance.log",
    benchmark:
        f"{R}/benchmarks/evaluate/acceptance.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/evaluate_acceptance.py"


rule evaluate_baselines:
    input:
        train=expand(f"{R}/store/train/shard-{{shard}}.zarr", shard=SHARDS),
        heldout=expand(f"{R}/store/heldout/shard-{{shard}}.zarr", shard=SHARDS),
        tables=error_tables("train") + error_tables("heldout"),  # see extract.smk
        # a gate, not data: a rerun of validation alone (e.g. a new threshold) does not rerun it
        validated=ancient(f"{R}/validate/summary.csv"),
        target=target_config(),
        identity=TARGET_IDENTITY,
    output:
        json=f"{R}/evaluate/baselines.json",
    params:
        target=lambda wildcards, input: os.path.dirname(input.target),
        max_len=config["train"]["max_len"],
        probe_epochs=EVAL["baselines"]["probe_epochs"],
        probe_width=EVAL["baselines"]["probe_width"],
    threads: 2
    resources:
        # a count table and a small probe: a CPU job (no gpu), and SLURM's -c is its threads
        cpus_per_task=2,
    log:
        f"{R}/logs/evaluate/baselines.log",
    benchmark:
        f"{R}/benchmarks/evaluate/baselines.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/evaluate_baselines.py"


rule evaluate_speculate:
    input:
        prompts=f"{R}/data/heldout.jsonl",
        drafter=f"{R}/train/drafter/model.safetensors",
        target=target_config(),
        identity=TARGET_IDENTITY,
    output:
        json=f"{R}/evaluate/speculate.json",
    params:
        drafter=lambda wildcards, input: os.path.dirname(input.drafter),
        target=lambda wildcards, input: os.path.dirname(input.target),
        architecture=config["target"]["architecture"],
        evaluate=EVAL,
    # Batch-1 decoding of small matrices: one thread is as fast on a free CPU and far steadier
    # on a busy one (spinning threads slow a multi-token verify pass many times over).
    threads: 1
    resources:
        gpu=int(EVAL["device"] != "cpu"),
    log:
        f"{R}/logs/evaluate/speculate.log",
    benchmark:
        f"{R}/benchmarks/evaluate/speculate.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/speculate.py"


rule evaluate_sglang:
    input:
        prompts=f"{R}/data/heldout.jsonl",
        target=target_config(),
        identity=TARGET_IDENTITY,
        draft=SGLANG_DRAFT,
    output:
        json=f"{R}/evaluate/online_sglang.json",
    params:
        target=lambda wildcards, input: os.path.dirname(input.target),
        draft=lambda wildcards, input: input.draft[0] if input.draft else "",
        backend=config["capture"]["backend"],
        evaluate=EVAL,
        log_dir=f"{R}/logs/evaluate/sglang",
    # Without SGLang capture this job only writes "not run": no GPU job for that.
    localrule: not ONLINE_SGLANG
    resources:
        gpu=int(ONLINE_SGLANG),
    log:
        f"{R}/logs/evaluate/sglang.log",
    benchmark:
        f"{R}/benchmarks/evaluate/sglang.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/online_sglang.py"


rule report:
    input:
        acceptance=f"{R}/evaluate/acceptance.json",
        speculate=f"{R}/evaluate/speculate.json",
        online=f"{R}/evaluate/online_sglang.json",
        train_metrics=f"{R}/train/metrics.csv",
        validate=f"{R}/validate/summary.csv",
        baselines=f"{R}/evaluate/baselines.json",
        problems=expand(f"{R}/data/{{split}}.problems.csv", split=SPLITS),
    output:
        summary=report(
            f"{R}/report/summary.md",
            caption="../report/summary.rst",
            category="1. Verdict",
        ),
        acceptance=report(
            f"{R}/report/acceptance.png",
            caption="../report/acceptance.rst",
            category="2. Acceptance",
        ),
        tau=report(
            f"{R}/report/tau.png",
            caption="../report/tau.rst",
            category="2. Acceptance",
        ),
        speed=report(
            f"{R}/report/speed.png",
            caption="../report/speed.rst",
            category="3. Speculative decoding",
        ),
        training=report(
            f"{R}/report/training.png",
            caption="../report/training.rst",
            category="4. Training",
        ),
        extraction=report(
            f"{R}/report/extraction.png",
            caption="../report/extraction.rst",
            category="5. Extraction",
        ),
        # the HTML report's landing page: report/workflow.rst includes it
        landing=f"{R}/report/landing.rst",
    params:
        figures=REPORT_FIGURES,
    log:
        f"{R}/logs/report.log",
    benchmark:
        f"{R}/benchmarks/report.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/report.py"
