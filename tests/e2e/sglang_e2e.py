"""The SGLang backend end to end on a GPU: workflow extract, validate, transformers comparison,
and the cost of the patch in throughput. Run by scripts/gpu_e2e_sglang.sh.

1. build toy-deepseek (MLA + MoE, seeded random weights; the size SGLang was seen serving);
2. run the workflow itself (snakemake: prepare_dataset, regenerate, verify_env, patch_server,
   extract with capture.backend: sglang, validate_shard) on tests/configs/gpu-sglang.yaml: 240
   samples, SGLang's --chunked-prefill-size 128, so long prompts arrive in several passes;
3. require zero validation errors;
4. extract the same samples with the transformers backend (cuda, bf16) from the conversations
   file the workflow's store records in its provenance (the regenerated split), and compare the
   stores: identical input_ids, mean per-token cosine >= 0.999 on every aux layer and the final
   state; where ids differ, the summary names the samples, both lengths and the first
   differing position;
5. time the same requests against a patched and an unpatched server (same flags otherwise):
   the throughput ratio is the patch's cost;
6. force the other mechanism, the import hook, on the same release and check that SGLang's own
   aux capture, switched on by the finder, gives the states the forward hooks gave.

`--standin` rehearses all of it on the CPU with the transformers-backed stand-in server and a
tiny toy-deepseek, reading SGLang 0.5.12's source from the verify cache (pip:0.5.12).
Writes at most 8 files to --out: summary.json, summary.md, compare.json, validate.json,
manifest.json, logs.txt.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from eyrie.store.compare import ids_report_lines

from .harness import REPO, Run, finish


def markdown(summary: dict) -> str:
    v = summary["versions"]
    lines = [
        "# SGLang backend, end to end",
        "",
        f"{summary['date']} - {summary['mode']} - {v.get('gpu') or 'no GPU'} - "
        f"python {v['python']}, torch {v['torch']}, transformers {v['transformers']}, "
        f"sglang {v['sglang']}, snakemake {v['snakemake']}, zarr {v['zarr']}",
        "",
        f"**Result: {'PASS' if summary['ok'] else 'FAIL'}** in {summary.get('seconds')} s",
    ]
    if summary.get("error"):
        lines += ["", "```", summary["error"][-3000:], "```"]
    lines += ["", "| step | ok | seconds |", "|---|---|---|"]
    lines += [f"| {k} | {s['ok']} | {s['seconds']} |" for k, s in summary["steps"].items()]
    w = summary.get("workflow")
    if w:
        lines += [
            "",
            f"Workflow extract (capture.backend: sglang, {w['mechanism']}): {w['samples']} "
            f"samples, {w['tokens']} tokens; {w['samples_longer_than_chunk']} longer than the "
            f"{w['chunked_prefill_size']}-token prefill chunk (longest {w['longest']}). "
            f"Validate: {w['validate_errors']} errors, worst cosine {w['validate_cosine']}, "
            f"greedy match {w['validate_greedy_match']}.",
            "",
            f"Mechanism: {w['mechanism_why']}.",
        ]
    c = summary.get("compare")
    if c:
        lines += [
            "",
            f"SGLang vs transformers ({c['hf_device']}), {c['samples']} samples, "
            f"{c['tokens']} tokens, "
            f"input_ids identical: {c['input_ids_identical']}; both extracted "
            f"{(summary.get('hf') or {}).get('data_path', '?')} (the store's provenance)",
            "",
            "| layer | mean cos | p01 | min | share < 0.999 |",
            "|---|---|---|---|---|",
        ]
        for name, x in c["layers"].items():
            if x["mean"] is None:  # no shared sample with identical ids: nothing to compare
                lines.append(f"| {name} | - | - | - | - |")
                continue
            lines.append(
                f"| {name} | {x['mean']:.6f} | {x['p01']:.6f} | {x['min']:.6f} | {x['below']:.2%} |"
            )
        if differ := ids_report_lines(c):
            lines += ["", "What kept samples from being compared (a: SGLang, b: transformers):"]
            lines.append("")
            lines += [f"  - {ln.strip()}" if ln[:1] == " " else f"- {ln}" for ln in differ]
    t = summary.get("throughput")
    if summary.get("throughput_skipped"):
        lines += ["", f"Throughput not measured: {summary['throughput_skipped']}."]
    ih = summary.get("import_hook")
    if summary.get("import_hook_skipped"):
        lines += ["", f"Import hook not checked: {summary['import_hook_skipped']}."]
    if ih:
        cos = ", ".join(f"{k} {v:.6f}" for k, v in ih["mean_cosine_vs_forward_hooks"].items())
        lines += [
            "",
            f"Import hook (mechanism import_hook forced on the same release), {ih['samples']} "
            f"samples, mean cosine against the forward hooks' store: {cos}.",
        ]
    if t:
        lines += [
            "",
            f"Throughput, {t['requests']} requests ({t['tokens']} prompt tokens, max_new_tokens 1,"
            f" {t['concurrency']} in flight): unpatched {t['plain_tokens_per_s']:.0f} tok/s, "
            f"patched (dumps written and read back) {t['patched_tokens_per_s']:.0f} tok/s, "
            f"ratio **{t['ratio']:.3f}**.",
        ]
    return "\n".join(lines) + "\n"


class SglangRun(Run):
    config_file = REPO / "tests" / "configs" / "gpu-sglang.yaml"
    render = staticmethod(markdown)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/out/gpu-sglang")
    p.add_argument("--work", help="scratch folder (default: a new temporary one)")
    p.add_argument("--standin", action="store_true", help="CPU rehearsal with the stand-in")
    p.add_argument("--skip-bench", action="store_true", help="no throughput measurement")
    p.add_argument(
        "--skip-import-hook", action="store_true", help="no check of the import-hook mechanism"
    )
    p.add_argument("--budget-s", type=float, default=480.0, help="time for all steps")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (capture.sglang.tp)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="eyrie-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    run = SglangRun(out, work, args.standin, args.budget_s, tp=args.tp)

    def steps():
        target = run.step("build toy-deepseek", run.build_target)
        config = run.write_config(target)
        manifest = run.step("workflow extract + validate", run.workflow, config)
        hf = run.step("transformers extract", run.hf_extract)
        run.step("compare stores", run.compare, hf)
        if args.skip_bench:
            run.summary["throughput_skipped"] = "--skip-bench"
        elif run.budget - (time.monotonic() - run.t0) < 150:
            run.summary["throughput_skipped"] = "under 150 s of the time budget left"
        else:
            run.step("throughput", run.throughput, manifest)
        if args.skip_import_hook:
            run.summary["import_hook_skipped"] = "--skip-import-hook"
        elif args.standin:
            run.summary["import_hook_skipped"] = "the stand-in has no SGLang model module"
        elif run.budget - (time.monotonic() - run.t0) < 120:
            run.summary["import_hook_skipped"] = "under 120 s of the time budget left"
        else:
            run.step("import hook", run.import_hook)

    return finish(run, steps, "eyrie SGLang end to end")


if __name__ == "__main__":
    sys.exit(main())
