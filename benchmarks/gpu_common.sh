# Sourced by the benchmarks/gpu_*.sh scripts: the checkout root as the working folder, eyrie
# importable from it, and gpu_machine, which prints what the figures were measured on.
# shellcheck shell=bash
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# gpu_machine MODULE...: the GPUs (name, memory, driver), then each Python module's version.
gpu_machine() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c 'import importlib, sys
print(" | ".join(m + " " + importlib.import_module(m).__version__ for m in sys.argv[1:]))' "$@"
}
