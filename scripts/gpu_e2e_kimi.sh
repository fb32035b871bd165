#!/usr/bin/env bash
# The wrapper chain live on one GPU (tests/e2e/kimi_e2e.py): builds toy-kimi-k25
# (KimiK25ForConditionalGeneration around toy-deepseek's MLA + MoE language model), runs the
# workflow's own regenerate and extract rules with capture.backend: sglang through snakemake
# (tests/configs/gpu-kimi.yaml: 64 samples, 128-token prefill chunks), validates the store with
# zero errors, compares it with an independent transformers forward of the wrapper's
# language-model tensors (cuda, bf16) on the same conversations, then runs the negative
# controls: verify on a copy of SGLang whose wrapper no longer passes the capture on, and a
# server hooked at module names the wrapper does not have. About 4-5 minutes, two server
# starts; stops itself at 350 s (LIMIT_S).
#
# From the checkout root on the GPU machine, with the kit of shared/gpu/README.md and Eyrie's
# wheels (scripts/gpu_wheels.sh: .gpu/w1a, .gpu/w1b, .gpu/w2, then .gpu/w3, one call each):
#
#   export PYTHONPATH=/tmp/site TVM_FFI_CACHE_DIR=/tmp/tvmffi && scripts/gpu_e2e_kimi.sh
#
# .gpu/w3 is installed into /tmp/site here when it is present and zarr is not importable yet.
# Results (at most 8 files: summary.json, summary.md, compare.json, validate.json,
# manifest.json, negative.json, logs.txt) go to $OUT (default benchmarks/out/gpu-kimi). Extra
# arguments go to `python3 -m e2e.kimi_e2e` (e.g. --standin for a CPU rehearsal, or
# `--import-hook --budget-s 380` with LIMIT_S=400 to also force the import-hook mechanism).
#
# CI (.ci/run) runs `LIMIT_S=600 scripts/gpu_e2e_kimi.sh --standin --budget-s 560` on the CPU in
# a fresh virtualenv without sglang or .gpu/: the stand-in server, a tiny toy, 24 samples, both
# negative controls; about 2 min on a 2-core CPU, up to 5.5 with its cores shared by other work.
set -euo pipefail
cd "$(dirname "$0")/.."

export OUT=${OUT:-benchmarks/out/gpu-kimi}
# shellcheck source=tests/e2e/gpu_env.sh
source tests/e2e/gpu_env.sh
exec timeout --signal=TERM --kill-after=10 "${LIMIT_S:-350}" python3 -m e2e.kimi_e2e --out "$OUT" "$@"
