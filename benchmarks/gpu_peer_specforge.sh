#!/usr/bin/env bash
# SpecForge beside Eyrie on the real model, after scripts/gpu_smollm2.sh on the same machine:
# SpecForge 0.2.0 trains its EAGLE-3 drafter on that run's stores with the budget Eyrie's
# drafter had (the same epochs, batch size, max_len, unroll and learning rate, read from
# Eyrie's drafter.json), then its drafter is
#   - scored by Eyrie's offline acceptance on the same held-out rows (peer_specforge.py score),
#   - written as an Eyrie drafter folder and exported (eyrie export),
#   - decoded by the transformers loop and served by SGLang with the run's own settings
#     (eyrie speculate --backend hf / sglang), as Eyrie's drafter was.
#
#   benchmarks/gpu_peer_specforge.sh [--results DIR] [--pieces DIR] [--lr LR] [--cpu]
#
# --results DIR  the SmolLM2 run's results (default results-smollm2; results-smollm2-cpu with --cpu)
# --pieces DIR   SpecForge's wheels and those it needs beyond the GPU kit, cut by
#                `scripts/gpu_packages.sh --specforge` into .gpu/sf1, .gpu/sf2 (carry each:
#                cp .gpu/sfN/* DIR/); joined, hash-checked and installed with --no-index
#                --no-deps into /tmp/sf-site. Without it, specforge must import already.
# --lr LR        SpecForge's learning rate (default: Eyrie's train.lr; 1e-4 is SpecForge's own)
# --cpu          the CPU rehearsal: float32 features, SPECFORGE_DEVICE=cpu, the transformers
#                loop only (no SGLang)
# Results go to $OUT (default benchmarks/out/gpu-peer-specforge): the acceptance JSONs of both
# drafters, the loop's and SGLang's records, and SpecForge's training log.
set -euo pipefail
cd "$(dirname "$0")/.."
res="" pieces="" lr="" cpu=""
while [ $# -gt 0 ]; do
  case "$1" in
    --results) res=$2; shift 2 ;;
    --pieces) pieces=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --cpu) cpu=1; shift ;;
    *) echo "error: unknown argument $1 (see the head of $0)" >&2; exit 2 ;;
  esac
done
configs=(configs/smollm2.yaml)
if [ -n "$cpu" ]; then
  res=${res:-results-smollm2-cpu} configs+=(configs/smollm2-cpu.yaml) device=cpu dtype=float32
else
  res=${res:-results-smollm2} device=cuda dtype=bfloat16
fi
OUT=${OUT:-benchmarks/out/gpu-peer-specforge}
work=${WORK:-/tmp/sf-peer}
mkdir -p "$OUT" "$work"
# shellcheck source=benchmarks/specforge_env.sh
source benchmarks/specforge_env.sh
python3 -c "import specforge, datasets" ||
  { echo "error: SpecForge does not import; carry its pieces (--pieces DIR)" >&2; exit 2; }

# Eyrie's EAGLE-3 drafter of the run (kept in eagle3/ when DFlash was trained after it)
eagle3=$res
[ -f "$res/eagle3/train/drafter/drafter.json" ] && eagle3=$res/eagle3
template=$eagle3/train/drafter
read -r target epochs batch max_len ttt eyrie_lr < <(python3 -c "import json, sys
d = json.load(open(sys.argv[1]))
assert d['method'] == 'eagle3', f\"{sys.argv[1]} is a {d['method']} drafter, not EAGLE-3\"
s = d['train']['settings']
print(d['target']['path'], s['epochs'], s['batch_size'], s['max_len'], s['ttt_steps'], s['lr'])" \
  "$template/drafter.json")
lr=${lr:-$eyrie_lr}
echo "target $target; budget: $epochs epochs, batch $batch, max_len $max_len, unroll $ttt, lr $lr"

# the run's config as one file: the subcommands read a whole config
merged=$work/config.yaml
python3 -m eyrie.cli.main config "${configs[0]}" >"$work/base.yaml"
if [ "${#configs[@]}" -gt 1 ]; then
  python3 -m eyrie.cli.main config --base "$work/base.yaml" "${configs[1]}" >"$work/base2.yaml"
  mv "$work/base2.yaml" "$work/base.yaml"
fi
overrides=$res/overrides.yaml  # scripts/gpu_smollm2.sh's --samples, --epochs, ... if any
if [ ! -s "$overrides" ]; then overrides=$work/none.yaml && echo "{}" >"$overrides"; fi
python3 -m eyrie.cli.main config --base "$work/base.yaml" "$overrides" >"$merged"

t0=$(date +%s)
python3 benchmarks/peer_specforge.py convert --results "$res" --target "$target" \
  --export "$eagle3/export/sglang" --dtype "$dtype" --max-len "$max_len" --out "$work/data"
echo "convert: $(($(date +%s) - t0)) s"
t1=$(date +%s)
python3 benchmarks/peer_specforge.py train --data "$work/data" --device "$device" --lr "$lr" \
  --epochs "$epochs" --batch-size "$batch" --ttt "$ttt" --max-len "$max_len" \
  2>&1 | tee "$OUT/specforge-train.log"
echo "train: $(($(date +%s) - t1)) s" | tee -a "$OUT/specforge-train.log"
ckpt=$(ls -d "$work"/data/out/*/*-latest | head -n 1)
python3 benchmarks/peer_specforge.py score --checkpoint "$ckpt" --results "$res" \
  --target "$target" --steps "$ttt" --max-len "$max_len" >"$OUT/specforge-acceptance.json"
cp "$eagle3/evaluate/acceptance.json" "$OUT/eyrie-acceptance.json"
python3 benchmarks/peer_specforge.py drafter --checkpoint "$ckpt" --template "$template" \
  --target "$target" --out "$work/drafter"
python3 -m eyrie.cli.main export --config "$merged" --drafter "$work/drafter" --out "$work/export"
python3 -m eyrie.cli.main speculate --config "$merged" --backend hf --drafter "$work/drafter" \
  --out "$OUT/specforge-speculate.json"
if [ -z "$cpu" ]; then
  python3 -m eyrie.cli.main speculate --config "$merged" --backend sglang \
    --drafter "$work/export/sglang" --out "$OUT/specforge-online.json"
fi
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for name in ("eyrie", "specforge"):
    a = json.loads((out / f"{name}-acceptance.json").read_text())
    acc = " / ".join(f"{x:.1%}" for x in a["acc"])
    print(f"{name:10s} acc_k {acc}  tau {a['tau']:.3f}  walk {a['walk_accept_length']:.3f}")
PY
