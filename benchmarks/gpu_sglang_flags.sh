#!/usr/bin/env bash
# Server flags against the speculative cycle's fixed cost, on one GPU: SGLang's EAGLE-3 at
# chains 3-1-4 and 7-1-8 beside the plain server, CUDA graphs on, random weights of a shape
# (benchmarks/sglang_grid.py --shape; SmolLM2-135M by default, where a cycle costs 2.7 plain
# steps), once per flag set below. Every set's plain server runs with the same flags, so each
# line's cycle/plain is its own. The first set also records SGLang's profiler over 40 steps of
# plain and of 3-1-4 (benchmarks/trace_summary.py: span, GPU busy time, top kernels).
# Needs the GPU kit of shared/gpu/README.md; from the checkout root on the GPU machine:
#   source .gpu/w2/install.sh && benchmarks/gpu_sglang_flags.sh
# SHAPE=smollm2-135m|llama-3.1-8b; OUT=benchmarks/out/gpu-flags (one grid JSON per set, the
# servers' logs and traces in one tarball); SETS="name=flags;..." replaces the sets below;
# LAUNCHER: a server command instead of SGLang's (the CPU rehearsal's stand-in).
set -euo pipefail
source "$(dirname "$0")/gpu_common.sh"
SHAPE=${SHAPE:-smollm2-135m}
OUT=${OUT:-benchmarks/out/gpu-flags}
LOGS=${LOGS:-$OUT/logs}
# spec-v1: SGLang's speculative loop without the overlap scheduler (v2 is its default for
# chains); decode-attn: verify with decode attention kernels instead of prefill ones; kv-splits:
# fewer split-K parts in triton's decode attention (8 by default) for short contexts;
# compile: torch.compile of the target's decode graphs at batch 1.
SETS=${SETS:-"base=;spec-v1=--disable-overlap-schedule;decode-attn=--speculative-attention-mode decode;kv-splits-2=--triton-attention-num-kv-splits 2;compile=--enable-torch-compile --torch-compile-max-bs 1"}
mkdir -p "$OUT" "$LOGS"
[[ -n ${LAUNCHER:-} ]] || gpu_machine sglang torch
launcher=()
[[ -n ${LAUNCHER:-} ]] && launcher=(--launcher "$LAUNCHER")
status=0
first=1
IFS=';' read -ra sets <<<"$SETS"
for set in "${sets[@]}"; do
  name=${set%%=*}
  flags=${set#*=}
  profile=()
  ((first)) && profile=(--profile plain 3-1-4)
  first=0
  echo "== $name: ${flags:-(the online flags alone)}"
  python3 benchmarks/sglang_grid.py --shape "$SHAPE" --grid 3-1-4 7-1-8 --parallel 3 \
    --max-total-tokens 4096 --prompts 6 --max-new-tokens 128 --extra-flags="$flags" \
    "${profile[@]}" "${launcher[@]}" --out "$OUT/flags-$name.json" --log-dir "$LOGS/$name" ||
    status=1
done
python3 - "$OUT" "${sets[@]}" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("\nset           plain step   3-1-4 cycle (/plain)   7-1-8 cycle (/plain)   flags")
for s in sys.argv[2:]:
    name, flags = s.split("=", 1)
    path = out / f"flags-{name}.json"
    summary = json.loads(path.read_text())["summary"] if path.exists() else {}
    if "plain_step_ms" not in summary:
        print(f"{name:<13} no measurement ({summary.get('status', 'no output')})")
        continue
    cells = {r["point"]: r for r in summary["grid"]}
    line = f"{name:<13} {summary['plain_step_ms']:7.3f} ms "
    for point in ("3-1-4", "7-1-8"):
        r = cells.get(point, {})
        line += (f"  {r['cycle_ms']:7.3f} ms ({r['cycle_over_plain']:.2f})      " if "cycle_ms" in r
                 else f"  {r.get('status', 'missing'):<22}")
    print(line + "  " + (flags or "-"))
PY
tar -czf "$OUT/flags-logs.tgz" -C "$LOGS" . || true
exit $status
