#!/usr/bin/env bash
# Builds, here (where PyPI is reachable), the wheels that Eyrie's GPU checks need on a GPU
# machine without registry access (Python 3.12 there), next to the SGLang kit of
# ../shared/gpu (fetch-wheels.sh makes .gpu/w1 and .gpu/w2):
#   .gpu/w1a, .gpu/w1b  .gpu/w1 cut in two, so that each piece plus this repository (34 MB)
#                       fits one 64 MiB transfer to the GPU machine: sglang_kernel alone (25 MB),
#                       then sglang, flashinfer and transformers (31 MB)
#   .gpu/w3             Eyrie's own dependencies (snakemake, zarr, numcodecs, pandas, ...) and
#                       pytest-xdist (pyproject's addopts; the machine's python has pytest) for
#                       CPython 3.12, minus what .gpu/w2 holds; pulp without its bundled solver
#                       binaries (Snakemake then uses its greedy scheduler)
# On the GPU machine, in four calls within the machine's idle window:
#   1. carry .gpu/w1a:          mkdir -p /tmp/wheels && cp .gpu/w1a/* /tmp/wheels/
#   2. carry .gpu/w1b:          cp .gpu/w1b/* /tmp/wheels/
#   3. carry .gpu/w2:           source .gpu/w2/install.sh
#   4. carry .gpu/w3:           scripts/gpu_e2e_sglang.sh
#                               (it finds SGLang in /tmp/site and installs .gpu/w3 there with
#                               pip install --no-index --no-deps --target /tmp/site itself);
#                               for benchmarks/gpu_*.sh, first:
#                               export PYTHONPATH=/tmp/site TVM_FFI_CACHE_DIR=/tmp/tvmffi
#                               python3 -m pip install -q --no-index --no-deps \
#                                 --target /tmp/site .gpu/w3/*.whl
# Needs pip and the `wheel` package. Versions follow envs/eyrie.yaml.
set -euo pipefail
top=$(git rev-parse --show-toplevel)
cd "$top"
[ -d .gpu/w1 ] && [ -d .gpu/w2 ] || { echo "run ../shared/gpu/fetch-wheels.sh first" >&2; exit 2; }
rm -rf .gpu/w1a .gpu/w1b .gpu/w3
mkdir -p .gpu/w1a .gpu/w1b .gpu/w3
cp .gpu/w1/sglang_kernel-*.whl .gpu/w1a/
cp .gpu/w1/sglang-*.whl .gpu/w1/flashinfer_python-*.whl .gpu/w1/transformers-*.whl .gpu/w1b/

pin() { sed -n "s/^ *- $1==\(.*\)$/\1/p" envs/eyrie.yaml; }
dl=$(mktemp -d); trap 'rm -rf "$dl"' EXIT
# 1. resolve the set for this interpreter (names and versions), sdists included
python3 -m pip download -q -d "$dl/all" "snakemake==9.27.1" "zarr==$(pin zarr)" \
  "numcodecs[crc32c]==$(pin numcodecs)" "pandas==$(pin pandas)" "tqdm==$(pin tqdm)" \
  "pyyaml==$(pin pyyaml)" 2>&1 | grep -v WARNING || true
norm() { basename "$1" | sed 's/-[0-9].*//' | tr 'A-Z-' 'a-z_'; }
skip=" numpy $(for f in .gpu/w2/*.whl; do printf '%s ' "$(norm "$f")"; done)"
binary=()
for f in "$dl"/all/*; do
  n=$(norm "$f")
  [[ "$skip" == *" $n "* ]] && continue
  case "$f" in
    *-cp3[0-9][0-9]-*) binary+=("$n==$(basename "$f" | cut -d- -f2)") ;;  # rebuilt below for 3.12
    *.tar.gz) python3 -m pip wheel -q --no-deps -w .gpu/w3 "$f" ;;        # pure-Python sdists
    *) cp "$f" .gpu/w3/ ;;
  esac
done
# 2. the compiled ones, for CPython 3.12 on manylinux x86_64
plat=""
for t in manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_34 manylinux2014 manylinux1 manylinux_2_5; do
  plat="$plat --platform ${t}_x86_64"
done
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  $plat -d .gpu/w3 "${binary[@]}" 2>&1 | grep -v WARNING || true
# 3. pulp without its solver binaries (35 MiB)
p=$(ls .gpu/w3/pulp-*.whl)
python3 -m wheel unpack -d "$dl/pulp" "$p" >/dev/null
rm -rf "$dl"/pulp/pulp-*/pulp/solverdir/cbc
python3 -m wheel pack --build-number 1slim -d .gpu/w3 "$dl"/pulp/pulp-* >/dev/null
rm -f "$p"
# 4. pytest's workers, for the GPU tests (pytest itself is the machine's)
python3 -m pip download -q --no-deps -d .gpu/w3 pytest-xdist==3.8.0 execnet==2.1.2 2>&1 |
  grep -v WARNING || true
echo "built: .gpu/w1a $(du -sh .gpu/w1a | cut -f1), .gpu/w1b $(du -sh .gpu/w1b | cut -f1)," \
  ".gpu/w3 $(du -sh .gpu/w3 | cut -f1) ($(ls .gpu/w3 | wc -l) wheels)"
