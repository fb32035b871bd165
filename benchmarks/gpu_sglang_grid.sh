#!/usr/bin/env bash
# SGLang's EAGLE-3 grid with CUDA graphs on one GPU (benchmarks/sglang_grid.py), twice:
#   toy  the default target (models/toy-llama-deep) with the default run's exported drafter:
#        measured speed-up and SGLang's accept length per chain and tree;
#   8b   random weights of Llama-3.1-8B's shape (--load-format dummy, bf16) with a random
#        EAGLE-3 drafter of that width: the cycle's cost at real scale, the cost model checked
#        against SpecBundle's published Llama-3.1-8B figure (chain 3-1-4: accept length 2.90,
#        2.13x), and the toy drafter's accept lengths projected at that scale.
# Needs the GPU kit of shared/gpu/README.md; from the checkout root on the GPU machine:
#   source .gpu/w2/install.sh && PART=8b benchmarks/gpu_sglang_grid.sh
# PART=toy|8b|both (both); EXPORT=results/export/sglang; OUT=benchmarks/out/gpu; the servers'
# logs go to one tarball in OUT.
set -euo pipefail
source "$(dirname "$0")/gpu_common.sh"
PART=${PART:-both}
EXPORT=${EXPORT:-results/export/sglang}
OUT=${OUT:-benchmarks/out/gpu}
LOGS=${LOGS:-benchmarks/out/gpu-grid-logs}
mkdir -p "$OUT" "$LOGS"
gpu_machine sglang torch
status=0
if [[ $PART == toy || $PART == both ]]; then
  python3 benchmarks/sglang_grid.py --target models/toy-llama-deep --draft "$EXPORT" \
    --parallel 10 --out "$OUT/grid-toy.json" --log-dir "$LOGS/toy" || status=1
fi
if [[ $PART == 8b || $PART == both ]]; then
  accept=()
  [[ -f $OUT/grid-toy.json ]] && accept=(--accept-from "$OUT/grid-toy.json")
  python3 benchmarks/sglang_grid.py --shape llama-3.1-8b --parallel 5 --max-total-tokens 4096 \
    --published 3-1-4:2.90:2.13 "${accept[@]}" --out "$OUT/grid-8b.json" \
    --log-dir "$LOGS/8b" || status=1
fi
tar -czf "$OUT/grid-logs.tgz" -C "$LOGS" . || true
exit $status
