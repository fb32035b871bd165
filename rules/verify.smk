# verify_env stage: check, before any GPU time is spent, that the capture backend delivers the
# aux hidden states of the target. capture.backend hf builds the transformers module tree on the
# meta device; sglang reads the SGLang release's source (verify.sglang) without importing it.
# The rule fails on an "unsupported" verdict, and on "patchable" when verify.strict is true.


rule verify_env:
    input:
        target=target_config(),
        identity=TARGET_IDENTITY,
    output:
        json=f"{R}/verify/report.json",
        md=f"{R}/verify/report.md",
    params:
        backend=config["capture"]["backend"],
        aux_layer_ids=config["capture"]["aux_layer_ids"],
        sglang=config["verify"]["sglang"],
        strict=config["verify"]["strict"],
        architecture=config["target"]["architecture"],
    log:
        f"{R}/logs/verify_env.log",
    benchmark:
        f"{R}/benchmarks/verify_env.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/verify_env.py"
