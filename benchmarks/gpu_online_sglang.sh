#!/usr/bin/env bash
# Speculative decoding on one GPU: the transformers loop on CUDA (benchmarks/bench_speculate.py)
# and SGLang's own acceptance and speed, with and without the exported EAGLE-3 drafter
# (python -m eyrie.evaluate.online). Both print the machine, plain and speculative tokens/s, the
# ratio and the accept length; results land in $OUT.
#
# Needs the GPU kit of shared/gpu/README.md (SGLang 0.5.12 and its wheels): piece 1 copied to
# /tmp/wheels, then from the checkout root on the GPU machine
#
#   source .gpu/w2/install.sh && benchmarks/gpu_online_sglang.sh
#
# with the trained drafter and its SGLang export brought along (results/ is not in git: carry
# results/train/drafter and results/export/sglang). Arguments (all optional):
#
#   benchmarks/gpu_online_sglang.sh [TARGET] [DRAFTER] [SGLANG_EXPORT]
#     TARGET         target model folder            (models/toy-llama)
#     DRAFTER        trained drafter, eyrie form    (results/train/drafter)
#     SGLANG_EXPORT  exported SGLang drafter folder (results/export/sglang)
#
# Environment: MODE=both|hf|sglang (both); K="1 2 3 4" (draft tokens swept by the transformers
# loop); SGLANG_K=3 (draft tokens for SGLang); PROMPTS=16; MAX_NEW=96; DTYPE=float32 (transformers
# loop); SGLANG_TIMEOUT=420 (seconds per server start); CUDA_GRAPH=both|true|false (both: each
# SGLang server with CUDA graphs, then eagerly with --disable-cuda-graph; both reported);
# OUT=benchmarks/out/gpu (on the device machine, set OUT=$OUT so the results come back);
# DATA=data/chat/heldout.jsonl.
set -euo pipefail

TARGET=${1:-models/toy-llama}
DRAFTER=${2:-results/train/drafter}
EXPORT=${3:-results/export/sglang}
MODE=${MODE:-both}
CUDA_GRAPH=${CUDA_GRAPH:-both}
K=${K:-1 2 3 4}
SGLANG_K=${SGLANG_K:-3}
PROMPTS=${PROMPTS:-16}
MAX_NEW=${MAX_NEW:-96}
DTYPE=${DTYPE:-float32}
SGLANG_TIMEOUT=${SGLANG_TIMEOUT:-420}
OUT=${OUT:-benchmarks/out/gpu}
DATA=${DATA:-data/chat/heldout.jsonl}

source "$(dirname "$0")/gpu_common.sh"
mkdir -p "$OUT"

for path in "$TARGET/config.json" "$DATA"; do
  [[ -f $path ]] || { echo "missing $path" >&2; exit 2; }
done
gpu_machine torch transformers

status=0
if [[ $MODE == both || $MODE == hf ]]; then
  [[ -f $DRAFTER/drafter.json ]] || { echo "missing $DRAFTER/drafter.json" >&2; exit 2; }
  echo "== transformers loop on CUDA ($DTYPE), draft tokens: $K"
  # shellcheck disable=SC2086  # K is a list of numbers
  python3 benchmarks/bench_speculate.py --target "$TARGET" --drafter "$DRAFTER" --device cuda \
    --dtype "$DTYPE" --draft-tokens $K --prompts "$PROMPTS" --max-new-tokens "$MAX_NEW" \
    --json "$OUT/bench_speculate_cuda.json" 2>&1 | tee "$OUT/bench_speculate_cuda.txt" \
    || status=1
fi

if [[ $MODE == both || $MODE == sglang ]]; then
  [[ -f $EXPORT/config.json ]] || { echo "missing $EXPORT/config.json" >&2; exit 2; }
  python3 -c 'import sglang; print("sglang", sglang.__version__)'
  echo "== SGLang online, EAGLE-3 chains of $SGLANG_K drafts"
  python3 -m eyrie.evaluate.online --target "$TARGET" --draft "$EXPORT" --prompts-jsonl "$DATA" \
    --prompts "$PROMPTS" --max-new-tokens "$MAX_NEW" --draft-tokens "$SGLANG_K" \
    --launch-timeout "$SGLANG_TIMEOUT" --cuda-graph "$CUDA_GRAPH" --out "$OUT/online_sglang.json" \
    --log-dir "$OUT/sglang-logs" 2>&1 | tee "$OUT/online_sglang.txt" || status=1
fi
exit $status
