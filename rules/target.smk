# Target stage: the configured target folder, or toy-deepseek built from its seed at run time.


rule build_toy_deepseek:
    input:
        tokenizer="models/toy-llama/tokenizer.json",
    output:
        config=f"{R}/targets/{TOY_DEEPSEEK}/config.json",
        weights=f"{R}/targets/{TOY_DEEPSEEK}/model.safetensors",
    params:
        out=f"{R}/targets/{TOY_DEEPSEEK}",
        tokenizer="models/toy-llama",
        seed=config["target"]["toy_seed"],
        tiny="--tiny" if config["target"]["toy_tiny"] else "",
    log:
        f"{R}/logs/build_toy_deepseek.log",
    benchmark:
        f"{R}/benchmarks/build_toy_deepseek.tsv"
    conda:
        "../envs/eyrie.yaml"
    shell:
        "python -m eyrie.toy.deepseek --out {params.out} --tokenizer {params.tokenizer}"
        " --seed {params.seed} {params.tiny} > {log} 2>&1"
