# Data stage: each split's chat JSONL, normalized to OpenAI messages, with every bad line in a
# problems table (dataset.on_bad_input: skip counts them; fail stops the run at the first).


rule prepare_dataset:
    input:
        source=dataset_source,
    output:
        jsonl=f"{R}/data/{{split}}.jsonl",
        problems=f"{R}/data/{{split}}.problems.csv",
    params:
        format=config["dataset"]["format"],
        on_bad_input=config["dataset"]["on_bad_input"],
        max_samples=lambda wildcards: config["dataset"]["max_samples"].get(wildcards.split),
    log:
        f"{R}/logs/prepare_dataset/{{split}}.log",
    benchmark:
        f"{R}/benchmarks/prepare_dataset/{{split}}.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/prepare_dataset.py"
