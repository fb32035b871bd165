#!/usr/bin/env bash
# What Eyrie's capture patch costs SGLang's prefill at Llama-3.1-8B's width, on one GPU
# (benchmarks/sglang_capture_overhead.py): random weights of that shape (--load-format dummy,
# bf16), the same prefill-only requests (max_new_tokens 1) to the capture server without the
# patch and to the server patched as extraction runs it, with every dump read back. Both servers
# are up at once (PAIRED=1, the default: unpatched and patched passes interleaved, so that a
# drift of the machine's speed moves both sides of a pair alike; the ratio is the median of the
# pairs'); PAIRED= measures one server after the other.
#   chat       the first 1024 samples of data/chat/train.jsonl (up to 512 tokens each)
#   synthetic  256 random prompts of 512 tokens each
# Needs the GPU kit of shared/gpu/README.md; from the checkout root on the GPU machine:
#   source .gpu/w2/install.sh && benchmarks/gpu_sglang_capture_overhead.sh
#   source .gpu/w2/install.sh && PART=synthetic benchmarks/gpu_sglang_capture_overhead.sh
# PART=chat|synthetic|both (chat: two server starts, about 5 minutes); CONCURRENCY="8 32"
# (requests in flight, each measured on the same two servers); PAIRED=1|''; DUMP_ROOT=/dev/shm (where the
# dumps go, capture.sglang.dump_root); WARMUP=1024 (untimed requests on each server first: a
# whole pass, since the 2026-12-04 paired run's first timed passes were its slowest); OUT=benchmarks/out/gpu; PASSES=3 (timed passes each);
# PY_SPY=path/to/py-spy (samples the patched server's scheduler during each concurrency's
# passes); BEFORE=DIR (a folder holding an earlier release's eyrie/ package, e.g. from
# `git archive COMMIT eyrie | tar -x -C DIR`): after each part, that release's patched server
# is measured too, against the same part's unpatched rates, as NAME-before. Writes
# capture-overhead-NAME.{json,txt} and one tarball (server logs, py-spy stacks, bundle, shape)
# to OUT.
set -euo pipefail
source "$(dirname "$0")/gpu_common.sh"
PART=${PART:-chat}
PAIRED=${PAIRED-1}
CONCURRENCY=${CONCURRENCY:-8 32}
OUT=${OUT:-benchmarks/out/gpu}
WORK=${WORK:-benchmarks/out/gpu-capture-overhead}
mkdir -p "$OUT" "$WORK"
gpu_machine sglang torch
df -h "${DUMP_ROOT:-/dev/shm}" || true  # the dump folder's file system
status=0
run() {  # run NAME ARGS...: one unpatched and one patched server
  local name=$1
  shift
  # shellcheck disable=SC2086  # CONCURRENCY is a list of numbers
  python3 benchmarks/sglang_capture_overhead.py --concurrency $CONCURRENCY \
    --passes "${PASSES:-3}" --warmup "${WARMUP:-1024}" ${PAIRED:+--paired} ${DUMP_ROOT:+--dump-root "$DUMP_ROOT"} ${PY_SPY:+--py-spy "$PY_SPY"} \
    --work "$WORK/$name" --json "$OUT/capture-overhead-$name.json" "$@" 2>&1 \
    | tee "$OUT/capture-overhead-$name.txt" || status=1
}
part() {  # part NAME ARGS...: this checkout's patch, then BEFORE's against the same unpatched
  local name=$1
  shift
  run "$name" "$@"
  if [[ -n ${BEFORE:-} && -f $OUT/capture-overhead-$name.json ]]; then
    if [[ -n $PAIRED ]]; then  # a pair of its own
      EYRIE_SOURCE=$BEFORE run "$name-before" "$@"
    else
      EYRIE_SOURCE=$BEFORE run "$name-before" "$@" \
        --unpatched-from "$OUT/capture-overhead-$name.json"
    fi
  fi
}
if [[ $PART == chat || $PART == both ]]; then
  part chat --samples 1024
fi
if [[ $PART == synthetic || $PART == both ]]; then
  part synthetic --synthetic-tokens 512 --samples 256
fi
tar -czf "$OUT/capture-overhead-logs-$PART.tgz" -C "$WORK" . || true  # logs, bundle, shape
exit $status
