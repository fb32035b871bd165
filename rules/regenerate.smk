# Regenerate stage (regenerate.enabled): the target answers each split's prompts itself, turn by
# turn, and its answers replace the dataset's assistant turns (docs/regenerate.md). Extraction
# and validation then read results/regen/{split}.jsonl instead of results/data/{split}.jsonl.
# A killed job resumes from its last finished chunk (a work file under results/regen/.work/).


rule regenerate:
    input:
        data=f"{R}/data/{{split}}.jsonl",
        overlap=ancient(f"{R}/data/overlap.json"),  # checked before any generation
        target=target_config(),
        identity=TARGET_IDENTITY,
    output:
        jsonl=f"{R}/regen/{{split}}.jsonl",
        summary=f"{R}/regen/{{split}}.summary.json",
    params:
        target=lambda wildcards, input: os.path.dirname(input.target),
        architecture=config["target"]["architecture"],
        settings={k: v for k, v in config["regenerate"].items() if k != "enabled"},
        sample_tokens=config["dataset"]["max_tokens"],  # no answers past the samples' cut
    threads: 2
    resources:
        mem_mb=8000,
        runtime=240,
        # a GPU when regenerate.device is cuda, or when the SGLang backend launches a server
        # (not with a server's url)
        gpu=int(
            not config["regenerate"]["sglang"].get("url")
            if config["regenerate"]["backend"] == "sglang"
            else config["regenerate"]["device"] == "cuda"
        ),
    log:
        f"{R}/logs/regenerate/{{split}}.log",
    benchmark:
        f"{R}/benchmarks/regenerate/{{split}}.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/regenerate.py"
