# Sourced by scripts/gpu_e2e_sglang.sh and scripts/gpu_e2e_kimi.sh, from the checkout root: puts
# SGLang and Eyrie's dependencies on PYTHONPATH and refuses to go on without them.
#
# When sglang is not importable yet it sources .gpu/w2/install.sh if .gpu/w2 was carried (not for
# a --standin rehearsal), else puts /tmp/site (where SGLang's kit was installed) on PYTHONPATH.
# When zarr or snakemake is not importable yet it installs Eyrie's own dependencies from the
# wheels in .gpu/w3 into /tmp/site with `pip install --no-index --no-deps --target /tmp/site`
# (their dependencies are SGLang's, already in /tmp/site, which pip does not look at there).
# tests/ and the checkout root come first on PYTHONPATH: the harness and eyrie run from them.

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
# tests/ first: the harness runs as the package e2e (`python3 -m e2e.sglang_e2e`), as the GPU
# tests import it; a `tests` package some wheel installs cannot shadow it.
export PYTHONPATH="$PWD/tests:$PWD${PYTHONPATH:+:$PYTHONPATH}"

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
