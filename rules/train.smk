# Train stage: the draft vocabulary from the validated train stores, the drafter (resumable:
# checkpoints live in {R}/train/work/, which is no rule's output, so a killed job reruns from
# its last checkpoint), and one checked export folder per serving engine.


wildcard_constraints:
    engine="sglang|vllm",


rule draft_vocab:
    input:
        stores=expand(f"{R}/store/train/shard-{{shard}}.zarr", shard=SHARDS),
        tables=error_tables("train"),  # a half-deleted store is extracted again first
        # a gate, not data: a rerun of validation alone (e.g. a new threshold) does not retrain
        validated=ancient(f"{R}/validate/summary.csv"),
        target=target_config(),
        identity=TARGET_IDENTITY,
    output:
        vocab=f"{R}/draft_vocab/vocab.safetensors",
        summary=f"{R}/draft_vocab/vocab.json",
    params:
        size=config["draft_vocab"]["size"],
    log:
        f"{R}/logs/draft_vocab.log",
    benchmark:
        f"{R}/benchmarks/draft_vocab.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/draft_vocab.py"


rule train_drafter:
    input:
        train=expand(f"{R}/store/train/shard-{{shard}}.zarr", shard=SHARDS),
        heldout=expand(f"{R}/store/heldout/shard-{{shard}}.zarr", shard=SHARDS),
        tables=error_tables("train") + error_tables("heldout"),
        # a gate, not data: a rerun of validation alone (e.g. a new threshold) does not retrain
        validated=ancient(f"{R}/validate/summary.csv"),
        vocab=f"{R}/draft_vocab/vocab.safetensors",
        target=target_config(),
        identity=TARGET_IDENTITY,
    output:
        weights=f"{R}/train/drafter/model.safetensors",
        meta=f"{R}/train/drafter/drafter.json",
        metrics=f"{R}/train/metrics.csv",
        heldout=f"{R}/train/heldout.json",
    params:
        settings=config["train"],
    threads: 8
    resources:
        # one GPU per training process, unless training runs on the CPU
        gpu=0 if config["train"]["device"] == "cpu" else int(config["train"]["processes"]),
    log:
        f"{R}/logs/train_drafter.log",
    benchmark:
        f"{R}/benchmarks/train_drafter.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/train_drafter.py"


rule export_drafter:
    input:
        weights=f"{R}/train/drafter/model.safetensors",
        meta=f"{R}/train/drafter/drafter.json",
        vocab=f"{R}/draft_vocab/vocab.safetensors",
        store=f"{R}/store/train/shard-000.zarr",
        table=f"{R}/store/train/shard-000.errors.csv",
        target=target_config(),
        identity=TARGET_IDENTITY,
    output:
        folder=directory(f"{R}/export/{{engine}}"),
        check=f"{R}/export/{{engine}}.check.json",
    params:
        export=config["export"],
    log:
        f"{R}/logs/export_drafter/{{engine}}.log",
    benchmark:
        f"{R}/benchmarks/export_drafter/{{engine}}.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/export_drafter.py"
