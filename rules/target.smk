# Target stage: the configured target folder, or a toy (toy-deepseek, toy-kimi-k25) built from its
# seed at run time.


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


if config["target"]["path"] in TOYS:

    # A toy's identity (rules/common.smk records a configured folder's while parsing): the
    # toy's files are this workflow's own outputs, so the rule reruns when they are rebuilt.
    rule target_identity:
        input:
            config=f"{R}/targets/{config['target']['path']}/config.json",
            weights=f"{R}/targets/{config['target']['path']}/model.safetensors",
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
