# Data stage: each split's chat JSONL, normalized to OpenAI messages, with every bad line in a
# problems table (dataset.on_bad_input: skip counts them; fail stops the run at the first).
# Each conversation is tokenized with the target's chat template, as extract will: a prompt
# longer than dataset.max_tokens is a bad line here, not an extraction error after the whole
# extraction. A split with no usable conversation stops the run here.


rule prepare_dataset:
    input:
        source=dataset_source,
        target=target_config(),
    output:
        jsonl=f"{R}/data/{{split}}.jsonl",
        problems=f"{R}/data/{{split}}.problems.csv",
    params:
        format=config["dataset"]["format"],
        on_bad_input=config["dataset"]["on_bad_input"],
        max_samples=lambda wildcards: config["dataset"]["max_samples"].get(wildcards.split),
        max_tokens=config["dataset"]["max_tokens"],
        target=lambda wildcards, input: os.path.dirname(input.target),
    log:
        f"{R}/logs/prepare_dataset/{{split}}.log",
    benchmark:
        f"{R}/benchmarks/prepare_dataset/{{split}}.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/prepare_dataset.py"
