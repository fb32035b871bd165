# Data stage: each split's chat file (JSON Lines, or one JSON array such as ShareGPT's, read as
# a stream), normalized to OpenAI messages, with every bad record in a problems table
# (dataset.on_bad_input: skip counts them; fail stops the run at the first). With regeneration
# on, a conversation without an assistant turn (MT-bench questions) is a prompt, kept.
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
        leading_assistant=config["dataset"]["leading_assistant"],
        max_samples=lambda wildcards: config["dataset"]["max_samples"].get(wildcards.split),
        max_tokens=config["dataset"]["max_tokens"],
        target=lambda wildcards, input: os.path.dirname(input.target),
        regenerate=config["regenerate"]["enabled"],
    log:
        f"{R}/logs/prepare_dataset/{{split}}.log",
    benchmark:
        f"{R}/benchmarks/prepare_dataset/{{split}}.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/prepare_dataset.py"


wildcard_constraints:
    splits="data|regen",


# Held-out samples that are train samples too (eyrie/data/overlap.py): the prepared splits
# (data/), and the regenerated ones (regen/) that extraction then reads. A shared sample stops
# the run, naming both files and the samples, unless dataset.allow_overlap counts it instead.
rule check_overlap:
    input:
        train=f"{R}/{{splits}}/train.jsonl",
        heldout=f"{R}/{{splits}}/heldout.jsonl",
    output:
        report=f"{R}/{{splits}}/overlap.json",
    params:
        sources={split: config["dataset"][split] for split in SPLITS},
        allow=config["dataset"]["allow_overlap"],
        # regenerated answers are the target's own: with regeneration, the same prompts count
        key="prompts" if config["regenerate"]["enabled"] else "conversation",
    log:
        f"{R}/logs/check_overlap/{{splits}}.log",
    benchmark:
        f"{R}/benchmarks/check_overlap/{{splits}}.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/check_overlap.py"


# What extraction waits for: the check of the splits it reads. ancient(): a gate, not data, so a
# passing recheck (e.g. after dataset.train changed) does not redo the other split's stores.
OVERLAP_CHECKED = ancient(
    f"{R}/regen/overlap.json" if config["regenerate"]["enabled"] else f"{R}/data/overlap.json"
)
