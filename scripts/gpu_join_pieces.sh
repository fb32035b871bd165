#!/usr/bin/env bash
# Joins the pieces scripts/gpu_packages.sh cut (FILE.part-00, FILE.part-01, ... in PIECES) into
# whole files in DEST, each written as DEST/FILE.tmp and renamed, then checks every whole file
# against PIECES/SHA256SUMS; a mismatch names the fix and exits non-zero.
#
#   scripts/gpu_join_pieces.sh PIECES DEST
set -euo pipefail
pieces=$(realpath "$1") dest=$2
mkdir -p "$dest"
for first in "$pieces"/*.part-00; do
  whole=$(basename "$first" .part-00)
  cat "$pieces/$whole".part-* >"$dest/$whole.tmp"
  mv "$dest/$whole.tmp" "$dest/$whole"
done
(cd "$dest" && sha256sum --quiet -c "$pieces/SHA256SUMS") ||
  { echo "error: a joined file in $dest does not match $pieces/SHA256SUMS; carry its pieces again" >&2; exit 1; }
