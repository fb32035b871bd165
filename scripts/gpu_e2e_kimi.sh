#!/usr/bin/env bash
# The wrapper chain live on one GPU (eyrie/sglang/kimi_e2e.py): builds toy-kimi-k25
# (KimiK25ForConditionalGeneration around toy-deepseek's MLA + MoE language model), runs the
# workflow's own extract rule with capture.backend: sglang through snakemake
# (tests/configs/gpu-kimi.yaml: 64 samples, 256-token prefill chunks), validates the store with
# zero errors, compares it with an independent transformers forward of the wrapper's
# language-model tensors (cuda, bf16), then runs the negative controls: verify on a copy of
# SGLang whose wrapper no longer passes the capture on, and a server hooked at module names the
# wrapper does not have. About 4-5 minutes, two server starts; stops itself at 350 s (LIMIT_S).
#
# From the checkout root on the GPU machine, with the kit of shared/gpu/README.md and Eyrie's
# wheels (scripts/gpu_wheels.sh: .gpu/w1a, then .gpu/w1b + .gpu/w2, then .gpu/w3):
#
#   export PYTHONPATH=/tmp/site TVM_FFI_CACHE_DIR=/tmp/tvmffi && scripts/gpu_e2e_kimi.sh
#
# .gpu/w3 is installed into /tmp/site here when it is present and zarr is not importable yet.
# Results (at most 8 files: summary.json, summary.md, compare.json, validate.json,
# manifest.json, negative.json, logs.txt) go to $OUT (default benchmarks/out/gpu-kimi). Extra
# arguments go to `python3 -m eyrie.sglang.kimi_e2e` (e.g. --standin for a CPU rehearsal, or
# `--import-hook --budget-s 380` with LIMIT_S=400 to also force the import-hook mechanism).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${PYTHONPATH:-}" ] || ! python3 -c "import sglang" 2>/dev/null; then
  if [ -f .gpu/w2/install.sh ] && [[ " $* " != *" --standin "* ]]; then
    # shellcheck disable=SC1091
    source .gpu/w2/install.sh
    set -euo pipefail  # install.sh ends with set +e
  fi
fi
if [ -d .gpu/w3 ] && ! python3 -c "import zarr, snakemake" 2>/dev/null; then
  echo "installing .gpu/w3 into /tmp/site"
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/w3/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OUT=${OUT:-benchmarks/out/gpu-kimi}

missing=$(python3 - <<'PY'
import importlib.util
need = ["torch", "transformers", "safetensors", "zarr", "numcodecs", "snakemake", "pandas",
        "yaml", "jsonschema", "tqdm"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
PY
)
if [ -n "$missing" ]; then
  echo "error: python3 cannot import: $missing (bring them as wheels in .gpu/w3)" >&2
  exit 2
fi

echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
exec timeout --signal=TERM --kill-after=10 "${LIMIT_S:-350}" python3 -m eyrie.sglang.kimi_e2e --out "$OUT" "$@"
