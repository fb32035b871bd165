#!/usr/bin/env bash
# Drafter training settings swept on one GPU, on stores of the default run's data (benchmarks/
# RESULTS.md, "drafter quality"). Extracts the default splits with capture.device cuda, builds
# the draft vocabulary, measures the baselines, then trains each variant with
# benchmarks/ablate_drafter.py (fp32, so figures compare with the CPU ablation), PARALLEL at a
# time. Every record goes to $OUT/sweep.jsonl; logs to $OUT/logs.
#   OUT=/tmp/sweep [REGEN=1] [RESULTS=results] benchmarks/gpu_drafter_sweep.sh [--skip-extract] \
#       [NAME=SETTINGS ...]
# REGEN=1: the target first regenerates both splits (eyrie regenerate, on the GPU, REGEN_BATCH
# conversations at a time) and the stores are made of its own answers. The target is config.yaml's.
# Every trained drafter is kept in ${KEEP:-$OUT/drafters}/NAME (for benchmarks/bench_speculate.py).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/sweep}; PARALLEL=${PARALLEL:-4}; R=${RESULTS:-results}
mkdir -p "$OUT/logs"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
skip=0; [ "${1:-}" = --skip-extract ] && { skip=1; shift; }
cfg=$OUT/config.yaml
python3 - "$cfg" "$R" "${REGEN_BATCH:-64}" <<'PY'
import sys, yaml
c = yaml.safe_load(open("config.yaml"))
c["capture"]["device"] = "cuda"
c["regenerate"].update(device="cuda", batch_size=int(sys.argv[3]))
c["results"] = sys.argv[2]
yaml.safe_dump(c, open(sys.argv[1], "w"))
PY
if [ $skip = 0 ]; then
  t0=$(date +%s)
  # the prepared splits (rule prepare_dataset); a machine without Snakemake may bring them along
  [ -f $R/data/heldout.jsonl ] || python3 -m snakemake --cores 8 --configfile "$cfg" \
    $R/data/train.jsonl $R/data/heldout.jsonl > "$OUT/logs/dataset.log" 2>&1
  data=data
  if [ "${REGEN:-0}" = 1 ]; then
    for split in train heldout; do
      python3 -m eyrie.cli.main regenerate --config "$cfg" --split $split --no-progress \
        > "$OUT/logs/regenerate-$split.log" 2>&1 &
    done; wait
    tail -n 1 "$OUT"/logs/regenerate-*.log; cp $R/regen/*.summary.json "$OUT/"
    data=regen
  fi
  for split in train heldout; do for shard in 0 1; do
    python3 -m eyrie.cli.main extract --config "$cfg" --split $split --shard $shard --no-progress \
      --data $R/$data/$split.jsonl > "$OUT/logs/extract-$split-$shard.log" 2>&1 &
  done; done; wait
  python3 -m eyrie.cli.main draft-vocab --config "$cfg" > "$OUT/logs/vocab.log" 2>&1
  echo "stores and vocabulary in $(( $(date +%s) - t0 )) s"; tail -n 1 "$OUT"/logs/extract-*.log
  python3 benchmarks/drafter_baselines.py --results $R --threads 8 --json "$OUT/baselines.json" \
    > "$OUT/logs/baselines.log" 2>&1 &
fi
base="epochs=4 batch_size=4 ttt_steps=1 attn_init=self lr=0.003 warmup_steps=10 device=cuda precision=fp32 num_workers=2"
variants=("$@")
pids=()
for v in "${variants[@]}"; do
  name=${v%%=*}; sets=${v#*=}
  python3 benchmarks/ablate_drafter.py --name "$name" --results $R --threads 2 \
    --keep-drafter "${KEEP:-$OUT/drafters}/$name" --log "$OUT/sweep.jsonl" --set $base $sets > "$OUT/logs/$name.log" 2>&1 &
  pids+=($!)
  [ ${#pids[@]} -ge "$PARALLEL" ] && { wait "${pids[@]}" || true; pids=(); }
done
wait
python3 - "$OUT/sweep.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"{r['name']:14s} steps {r['steps']:5d}  acc {' / '.join(f'{a:.3f}' for a in r['acc'])}  {r['wall_s']} s")
PY
[ -f "$OUT/baselines.json" ] && cat "$OUT/baselines.json" || tail -n 5 "$OUT/logs/baselines.log"
