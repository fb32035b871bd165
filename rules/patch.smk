# Patch stage (capture.backend: sglang): from verify_env's report, a bundle that makes an
# unmodified SGLang server dump the aux and final hidden states of the workflow's requests
# (docs/sglang-backend.md). Built only when extraction goes through SGLang.


# The bundle the extract jobs use: capture.sglang.bundle, or the one patch_server builds.
SGLANG_BUNDLE = config["capture"]["sglang"].get("bundle") or f"{R}/patch"
# Extra input of rule extract: the bundle, when capture.backend is sglang.
PATCH_INPUTS = [SGLANG_BUNDLE] if config["capture"]["backend"] == "sglang" else []
# The capture settings of rule extract, with the bundle's folder filled in for sglang.
EXTRACT_CAPTURE = (
    {**config["capture"], "sglang": {**config["capture"]["sglang"], "bundle": SGLANG_BUNDLE}}
    if config["capture"]["backend"] == "sglang"
    else config["capture"]
)


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
