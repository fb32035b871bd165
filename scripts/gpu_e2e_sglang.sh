#!/usr/bin/env bash
# The SGLang backend end to end on one GPU (eyrie/sglang/e2e.py): builds toy-deepseek, runs the
# workflow's own extract rule with capture.backend: sglang through snakemake
# (tests/configs/gpu-sglang.yaml: 240 samples, 256-token prefill chunks), validates the store
# with zero errors, extracts the same samples with the transformers backend (cuda, bf16) and
# compares the two, then times the same requests on a patched and an unpatched server.
#
# From the checkout root on the GPU machine, after steps 1 and 2 of scripts/gpu_wheels.sh's
# header (SGLang's kit in /tmp/wheels and /tmp/site), with .gpu/w3 carried:
#
#   scripts/gpu_e2e_sglang.sh
#
# When sglang is not importable yet it sources .gpu/w2/install.sh if .gpu/w2 was carried, else
# puts /tmp/site (where step 2 installed SGLang) on PYTHONPATH. When zarr or snakemake is not
# importable yet it installs Eyrie's own dependencies from the wheels in .gpu/w3 into
# /tmp/site with `pip install --no-index --no-deps --target /tmp/site` (their dependencies are
# SGLang's, already in /tmp/site, which pip does not look at there).
# Results (at most 8 files: summary.json, summary.md, compare.json, validate.json,
# manifest.json, logs.txt) go to $OUT (default benchmarks/out/gpu-sglang). Extra arguments go to
# `python3 -m eyrie.sglang.e2e` (e.g. --skip-bench, --standin for a CPU rehearsal).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${PYTHONPATH:-}" ] || ! python3 -c "import sglang" 2>/dev/null; then
  if [ -f .gpu/w2/install.sh ] && [[ " $* " != *" --standin "* ]]; then
    # shellcheck disable=SC1091
    source .gpu/w2/install.sh
    set -euo pipefail  # install.sh ends with set +e
  elif [ -d /tmp/site/sglang ]; then  # installed by step 2, .gpu/w2 not carried this time
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} TVM_FFI_CACHE_DIR=/tmp/tvmffi
  fi
fi
if [ -d .gpu/w3 ] && ! python3 -c "import zarr, snakemake" 2>/dev/null; then
  echo "installing .gpu/w3 into /tmp/site"
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/w3/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OUT=${OUT:-benchmarks/out/gpu-sglang}

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
exec timeout --signal=TERM --kill-after=30 600 python3 -m eyrie.sglang.e2e --out "$OUT" "$@"
