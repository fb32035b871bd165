# Patch stage (capture.backend: sglang): from verify_env's report, a bundle that makes an
# unmodified SGLang server dump the aux and final hidden states of the workflow's requests
# (docs/sglang-backend.md). Built only when extraction goes through SGLang.


rule patch_server:
    input:
        report=f"{R}/verify/report.json",
    output:
        bundle=directory(f"{R}/patch"),
    params:
        # only what shapes the bundle, so other capture settings do not rebuild it
        capture={
            "aux_layer_ids": config["capture"]["aux_layer_ids"],
            "sglang": {
                k: config["capture"]["sglang"][k]
                for k in ("mechanism", "dump_dir", "dump_root", "rid_prefix")
            },
        },
    log:
        f"{R}/logs/patch_server.log",
    benchmark:
        f"{R}/benchmarks/patch_server.tsv"
    conda:
        "../envs/eyrie.yaml"
    script:
        "../scripts/patch_server.py"
