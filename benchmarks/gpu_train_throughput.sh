#!/usr/bin/env bash
# Eyrie's and SpecForge's drafter training loops side by side on one GPU, at the 8B shape
# (issue 38): an EAGLE-3 drafter of Llama-3.1-8B's width (H 4096, 32 / 8 heads, MLP 14336, 3 aux
# states, draft vocabulary 32,000 of 128,256), bf16, batch 2 x 2,048 tokens, unroll 7, AdamW,
# random data (the FLOPs of real data). Eyrie: benchmarks/bench_train.py. SpecForge 0.2.0: its
# own offline trainer (benchmarks/peer_specforge.py train) over feature files written by
# benchmarks/peer_specforge_throughput.py synth. Both MFUs are over the bf16 8192^3 matmul that
# bench_train.py measures in the same run, so the ratio printed last compares like with like.
#
#   benchmarks/gpu_train_throughput.sh [--pieces DIR] [--steps N] [--size S] [--len T] [--cpu]
#
# --pieces DIR  SpecForge's wheels cut by `scripts/gpu_packages.sh --specforge` (.gpu/sfN, each
#               carried and copied to DIR), joined and installed into /tmp/sf-site
# --steps N     optimizer steps timed on each side (default 16; SpecForge logs every 2nd)
# --cpu         the CPU rehearsal: size "toy", 256 tokens, fp32; SpecForge from $SF_PYTHON
#               (a virtualenv with specforge 0.2.0) when set, else Eyrie's side only
# Output under $OUT (default benchmarks/out/gpu-train-throughput): eyrie.txt, specforge-train.log,
# specforge.txt and summary.txt (the machine, both lines, SpecForge's step time over Eyrie's).
set -euo pipefail
cd "$(dirname "$0")/.."
pieces="" steps=16 size=realistic len=2048 cpu="" device=cuda
while [ $# -gt 0 ]; do
  case "$1" in
    --pieces) pieces=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --len) len=$2; shift 2 ;;
    --cpu) cpu=1 size=toy len=256 device=cpu; shift ;;
    *) echo "error: unknown argument $1 (see the head of $0)" >&2; exit 2 ;;
  esac
done
OUT=$(realpath -m "${OUT:-benchmarks/out/gpu-train-throughput}")
work=$(realpath -m "${WORK:-/tmp/train-throughput}")
mkdir -p "$OUT" "$work"
sf_python=python3
# shellcheck source=benchmarks/specforge_env.sh
source benchmarks/specforge_env.sh
[ -n "$cpu" ] && sf_python=${SF_PYTHON:-}

python3 benchmarks/bench_train.py --size "$size" --device "$device" --batch-size 2 \
  --len "$len" --steps "$steps" --ttt-steps 7 --profile 25 | tee "$OUT/eyrie.txt"
# the matmul baseline bench_train.py measured, in FLOP/s, for SpecForge's MFU
peak=$(sed -n 's/.*MFU .* of the .* matmul (\([0-9.]*\) GFLOP\/s).*/\1e9/p' "$OUT/eyrie.txt")
[ -n "$peak" ] || { echo "error: no matmul baseline in $OUT/eyrie.txt" >&2; exit 1; }

if [ -z "$sf_python" ] || ! "$sf_python" -c "import specforge" 2>/dev/null; then
  echo "SpecForge does not import here (carry its pieces: --pieces DIR; on the CPU set SF_PYTHON):" \
    "Eyrie's side only" | tee "$OUT/summary.txt"
  [ -n "$cpu" ] && exit 0
  exit 2
fi
dtype=bfloat16
[ -n "$cpu" ] && dtype=float32
# one epoch of 2 x steps samples at batch 2: `steps` optimizer steps, one logged every 2nd
python3 benchmarks/peer_specforge_throughput.py synth --size "$size" --len "$len" \
  --samples $((2 * steps)) --dtype "$dtype" --out "$work/data"
"$sf_python" benchmarks/peer_specforge.py train --data "$work/data" --device "$device" \
  --epochs 1 --batch-size 2 --ttt 7 --max-len "$len" --log-interval 2 --eval-interval 100000 \
  2>&1 | tee "$OUT/specforge-train.log"
python3 benchmarks/peer_specforge_throughput.py summarize --size "$size" --len "$len" \
  --log "$OUT/specforge-train.log" --batch-size 2 --ttt 7 --peak "$peak" | tee "$OUT/specforge.txt"
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import re, sys
from pathlib import Path
out = Path(sys.argv[1])
eyrie = (out / "eyrie.txt").read_text().splitlines()
spec = (out / "specforge.txt").read_text().strip()
ms = lambda line: float(re.search(r"([0-9.]+) ms/step", line).group(1))  # noqa: E731
e = next(line for line in eyrie if "ms/step" in line)
print(eyrie[0])
print("Eyrie     " + e.strip())
print(spec)
print(f"Eyrie's step against SpecForge's: {ms(spec) / ms(e):.2f}x the speed (same run, same card)")
PY
