#!/usr/bin/env bash
# The scale rehearsal (issue 41): the whole workflow through Snakemake at growing sizes on one
# GPU, each stage's cost per token compared across sizes. A random-weight target of
# Llama-3.1-8B's shape (benchmarks/rehearsal_inputs.py, saved, so that validation compares
# SGLang with a transformers forward of the same weights), conversations of up to 2,048 tokens
# joined from the shipped ones, then extract -> validate -> draft_vocab -> train_drafter
# (H = 4096, bf16, unroll 7, max_len 2048, one epoch) -> export -> SGLang serves the export.
#
#   scripts/gpu_rehearsal.sh [--sizes "0.25e6 0.5e6 1e6"] [--lossy-size 2e6] [--cpu]
#
# --sizes      token counts, one run each, smallest first (each run's stores are deleted once
#              measured, so the 64 GiB disk holds one size at a time, plus the 16 GB target)
# --lossy-size one more run at extract.precision bitround-1 (0: none)
# --cpu        the CPU rehearsal: a tiny shape, transformers capture, 2 cores, 5 K and 10 K
#              tokens (CI runs it)
# Per size, under $OUT (default benchmarks/out/rehearsal): costs-SIZE.json (each stage's wall
# time, tokens/s, peak host memory, output bytes: benchmarks/stage_costs.py), and in
# summary.md the table of all sizes with each stage's cost per token against the smallest
# size's, the run's peak GPU memory and open files (sampled every 2 s), its disk use, and the
# size of Snakemake's bookkeeping.
set -euo pipefail
cd "$(dirname "$0")/.."
sizes="0.25e6 0.5e6 1e6" lossy=2e6 cpu="" cores=16
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) sizes=$2; shift 2 ;;
    --lossy-size) lossy=$2; shift 2 ;;
    --cpu) cpu=1; sizes="5e3 1e4"; lossy=0; cores=2; shift ;;
    *) echo "error: unknown argument $1 (see the head of $0)" >&2; exit 2 ;;
  esac
done
if [ -z "$cpu" ]; then
  # shellcheck source=tests/e2e/gpu_env.sh
  source tests/e2e/gpu_env.sh
fi
OUT=$(realpath -m "${OUT:-benchmarks/out/rehearsal}")
work=$(realpath -m "${WORK:-/tmp/eyrie-rehearsal}")
mkdir -p "$OUT" "$work"
shape=8b backend=sglang device=cuda workers=4
[ -n "$cpu" ] && shape=tiny backend=hf device=cpu workers=1
[ -f "$work/target/config.json" ] ||
  python3 benchmarks/rehearsal_inputs.py target --shape "$shape" --out "$work/target"

monitor() {  # time, GPU memory used (MiB), open files on the machine
  while :; do
    g=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n 1)
    f=$(find /proc/[0-9]*/fd -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    echo "$(date +%s),${g:-},$f"
    sleep 2
  done
}

run_size() {  # tokens precision
  local tokens=$1 precision=$2 name="$1-$2" res t0 rc=0
  res="results-rehearsal/$name"
  python3 benchmarks/rehearsal_inputs.py conversations --target "$work/target" \
    --tokens "$tokens" --out "$work/conv-$name.jsonl" >"$OUT/inputs-$name.json"
  cat >"$work/$name.yaml" <<YAML
results: $res
target: {path: $work/target}
dataset: {train: $work/conv-$name.jsonl, max_tokens: 2048, max_samples: {train: null, heldout: 16}}
regenerate: {enabled: false}
capture: {backend: $backend, device: $device}
extract: {precision: $precision}
validate: {min_cosine: 0.99}
train: {epochs: 1, batch_size: 2, max_len: 2048, ttt_steps: 7, num_workers: $workers}
evaluate: {prompts: 2, max_new_tokens: 32, sglang: {prompts: 4}}
YAML
  monitor >"$work/monitor-$name.csv" &
  local mon=$!
  t0=$(date +%s)
  python3 -m snakemake --cores "$cores" --configfile "$work/$name.yaml" --resources gpu=1 \
    --until export_drafter evaluate_sglang --rerun-incomplete >"$OUT/snakemake-$name.log" 2>&1 || rc=$?
  kill "$mon"
  echo "$name: snakemake exited $rc after $(($(date +%s) - t0)) s"
  python3 benchmarks/stage_costs.py "$res" --snakemake-dir .snakemake \
    --json "$OUT/costs-$name.json" >/dev/null
  python3 - "$OUT/costs-$name.json" "$work/monitor-$name.csv" "$res" <<'PY'
import json, subprocess, sys
costs, monitor, res = sys.argv[1:]
rows = [line.split(",") for line in open(monitor) if line.strip()]
gpu = [int(r[1]) for r in rows if r[1].strip()]
rec = json.load(open(costs))
rec.update(peak_gpu_mib=max(gpu) if gpu else None,
           peak_open_files=max(int(r[2]) for r in rows) if rows else None,
           results_bytes=int(subprocess.run(["du", "-sb", res], capture_output=True,
                                            text=True).stdout.split()[0]))
json.dump(rec, open(costs, "w"), indent=1)
PY
  rm -rf "$res/store" "$res/train/work"  # the next size needs the disk
  return "$rc"
}

rc=0
for s in $sizes; do run_size "$s" lossless || rc=$?; done
[ "$lossy" != 0 ] && { run_size "$lossy" bitround-1 || rc=$?; }
python3 benchmarks/stage_costs.py --compare "$OUT"/costs-*.json | tee "$OUT/summary.md"
exit "$rc"
