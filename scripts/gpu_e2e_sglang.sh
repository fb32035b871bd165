#!/usr/bin/env bash
# The SGLang backend end to end on one GPU (tests/e2e/sglang_e2e.py): builds toy-deepseek, runs the
# workflow's own regenerate and extract rules with capture.backend: sglang through snakemake
# (tests/configs/gpu-sglang.yaml: 240 samples, 128-token prefill chunks), validates the store
# with zero errors, extracts the same conversations (the file the store's provenance names) with
# the transformers backend (cuda, bf16) and compares the two, then times the same requests on a
# patched and an unpatched server.
#
# From the checkout root on the GPU machine, after steps 1 and 2 of scripts/gpu_wheels.sh's
# header (SGLang's kit in /tmp/wheels and /tmp/site), with .gpu/w3 carried:
#
#   scripts/gpu_e2e_sglang.sh
#
# When sglang is not importable yet it sources .gpu/w2/install.sh if .gpu/w2 was carried, else
# puts /tmp/site (where step 2 installed SGLang) on PYTHONPATH. When zarr or snakemake is not
# importable yet it installs Eyrie's own dependencies from the wheels in .gpu/w3 into
# /tmp/site with `pip install --no-index --no-deps --target /tmp/site` (their dependencies are
# SGLang's, already in /tmp/site, which pip does not look at there).
# Results (at most 8 files: summary.json, summary.md, compare.json, validate.json,
# manifest.json, logs.txt) go to $OUT (default benchmarks/out/gpu-sglang). Extra arguments go to
# `python3 -m e2e.sglang_e2e` (e.g. --skip-bench, --standin for a CPU rehearsal).
#
# CI (.ci/run) runs `scripts/gpu_e2e_sglang.sh --standin --skip-bench` on the CPU in a fresh
# virtualenv without sglang or .gpu/: the transformers-backed stand-in server, a tiny toy, 24
# samples, SGLang 0.5.12's source fetched into the verify cache; 1.5-3 min on a 2-core CPU, up
# to 5 with its cores shared by other work.
set -euo pipefail
cd "$(dirname "$0")/.."

export OUT=${OUT:-benchmarks/out/gpu-sglang}
# shellcheck source=tests/e2e/gpu_env.sh
source tests/e2e/gpu_env.sh
exec timeout --signal=TERM --kill-after=30 600 python3 -m e2e.sglang_e2e --out "$OUT" "$@"
