#!/usr/bin/env bash
# DDP scaling of drafter training on one host: the workflow's own train_drafter rule on the same
# stores with train.processes 1, then 2 (torchrun, NCCL). Prints held-out accuracy per unroll
# step and training tokens/s of both, and the ratio. Needs 2 GPUs and Eyrie's dependencies.
#
#   benchmarks/gpu_ddp_train.sh [RESULTS_DIR]        (results land in $OUT when it is set)
set -euo pipefail
source "$(dirname "$0")/gpu_common.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=${1:-/tmp/eyrie-ddp}
OUT=${OUT:-benchmarks/out/gpu-ddp}
mkdir -p "$OUT"
date -u +%Y-%m-%dT%H:%M:%SZ
gpu_machine torch
for n in 1 2; do
  # Training resumes from its last checkpoint whatever the number of processes (the global
  # batches do not depend on it), so each run starts from a clean train folder.
  rm -rf "$R/train"
  printf 'train:\n  processes: %s\n' "$n" > "$R.p$n.yaml"
  python3 -m snakemake --cores 16 --nolock --configfile tests/configs/gpu-ddp.yaml "$R.p$n.yaml" \
    --config results="$R" --rerun-triggers params input --quiet rules -- "$R/train/heldout.json" \
    > "$OUT/snakemake-p$n.log" 2>&1 || { tail -40 "$OUT/snakemake-p$n.log"; exit 1; }
  cp "$R/train/heldout.json" "$OUT/heldout-p$n.json"
  cp "$R/train/metrics.csv" "$OUT/metrics-p$n.csv"
  cp "$R/benchmarks/train_drafter.tsv" "$OUT/train-benchmark-p$n.tsv" 2>/dev/null || true
done
python3 - "$OUT" <<'PY'
import json, sys
import pandas as pd
out = sys.argv[1]
rate = {}
for n in (1, 2):
    held = json.load(open(f"{out}/heldout-p{n}.json"))
    m = pd.read_csv(f"{out}/metrics-p{n}.csv")
    # Same global batches in both runs: optimizer steps per second is the throughput; the
    # first step (start-up, NCCL set-up, kernel selection) is left out.
    steps, seconds = len(m) - 1, m["elapsed_s"].iloc[-1] - m["elapsed_s"].iloc[0]
    rate[n] = steps / seconds
    acc = ", ".join(f"{a:.3f}" for a in held["acc"])
    print(f"processes {n}: {steps} steps in {seconds:.1f} s ({rate[n]:.2f} steps/s, "
          f"{m['tokens'].iloc[1:].sum() / seconds:.0f} tokens/s as logged); held-out acc [{acc}]")
print(f"scaling 2 GPUs / 1 GPU: {rate[2] / rate[1]:.2f}x (goal >= 1.8x)")
PY
