"""The wrapper chain live: toy Kimi-K2.5 served by SGLang, extracted, checked, and broken on
purpose. Run by scripts/gpu_e2e_kimi.sh.

Kimi-K2.5's SGLang class `KimiK25ForConditionalGeneration` holds a `DeepseekV3ForCausalLM`
(`language_model`), which holds the `DeepseekV2Model` whose layers are captured. This runs that
chain at toy scale (eyrie/target/toy/kimi.py: toy-deepseek's language model inside a tiny vision
tower and projector), reusing the steps of tests/e2e/sglang_e2e.py:

1. build toy-kimi-k25 (seeded; the language model has the dimensions SGLang 0.5.12 serves);
2. the workflow itself (snakemake: prepare_dataset, regenerate, verify_env, patch_server,
   extract with capture.backend: sglang, validate_shard) on tests/configs/gpu-kimi.yaml: 64
   samples, 128-token prefill chunks; validate must report zero errors. The hooks sit on
   `language_model.model.layers.i`, the names verify derives from the chain;
3. parity: the same samples (the conversations file the store's provenance names) through an
   independent transformers forward of the wrapper's language-model tensors
   (`DeepseekV3ForCausalLM` built from `text_config`, the `language_model.*` tensors loaded
   strictly; eyrie/target/wrapped.py), CUDA bf16: identical input ids and mean cosine >= 0.999 on
   every aux layer and the final state;
4. negative controls (tests/e2e/kimi_controls.py): (a) verify against a copy of the verified
   SGLang source whose wrapper no longer passes `set_eagle3_layers_to_capture` on must say so with
   file:line; the strict stage refuses it, the patch stage calls the setter on the inner model
   instead, and the extraction refuses the copy's bundle on the real installation; (b) a server
   whose hooks name the plain causal LM's modules (`model.layers.i`, which the wrapper does not
   have) must make the extraction fail loudly, never store anything;
5. with --import-hook, the other mechanism forced on the same release (the finder switches
   SGLang's own capture on at the wrapper, which passes it to its language model) must give the
   states the forward hooks gave.

SGLang builds a multimodal processor for this architecture at start; the toy ships none, so the
server gets SGLang's own extension point SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE naming
eyrie.target.toy.sglang_text_only (a processor that accepts text only).

`--standin` rehearses all of it on the CPU with the transformers-backed stand-in server (which
mounts the language model at `language_model`, as the wrapper does) and a tiny toy, reading
SGLang 0.5.12's source from the verify cache (pip:0.5.12). Writes at most 8 files to --out:
summary.json, summary.md, compare.json, validate.json, manifest.json, negative.json, logs.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from eyrie.target.toy.sglang_text_only import ENV as PROCESSOR_ENV
from eyrie.target.toy.sglang_text_only import PACKAGE as PROCESSOR_PACKAGE

from .harness import REPO, StepError, finish, run_cmd
from .sglang_e2e import SglangRun, markdown

CONFIG = REPO / "tests" / "configs" / "gpu-kimi.yaml"
TOY = "toy-kimi-k25"


def kimi_markdown(summary: dict) -> str:
    text = markdown(summary).replace(
        "# SGLang backend, end to end", "# Toy Kimi-K2.5 (wrapper chain), SGLang backend end to end"
    )
    t = summary.get("target")
    lines = [text.rstrip("\n")]
    if t:
        lines += ["", f"Target: {t['name']} ({t['architecture']}); reference: {t['reference']}."]
    neg = summary.get("negative") or {}
    nd = neg.get("no_delegation")
    if nd:
        lines += [
            "",
            "Negative control (a): the wrapper's delegation removed from a copy of the verified "
            f"source ({nd['removed']}): verdict **{nd['verdict']}** - {nd['why']}",
            f"- strict stage: {nd['strict_failure']}",
            f"- patch stage: {nd['patch']}",
            f"- extraction on the real installation: {nd['installed_check']}",
        ]
    wh = neg.get("wrong_hook_path")
    if wh and "skipped" in wh:
        lines += ["", f"Negative control (b) not run: {wh['skipped']}."]
    elif wh:
        lines += [
            "",
            f"Negative control (b): hooks on {wh['hooked']} (the plain causal LM's names): "
            f"extraction failed loudly: {wh['error']}",
        ]
        if wh.get("server_log"):
            lines += ["", "```", *wh["server_log"], "```"]
    return "\n".join(lines) + "\n"


class KimiRun(SglangRun):
    config_file = CONFIG
    render = staticmethod(kimi_markdown)

    def build_target(self) -> Path:
        target = self.work / TOY
        cmd = [sys.executable, "-m", "eyrie.target.toy.kimi", "--out", str(target)]
        cmd += ["--tokenizer", str(REPO / "models" / "toy-llama")]
        if self.standin:
            cmd.append("--tiny")
        run_cmd(cmd, self.work / "logs" / "toy.log", self.left())
        self.summary["target"] = {
            "name": TOY,
            "architecture": json.loads((target / "config.json").read_text())["architectures"][0],
            "reference": "transformers DeepseekV3ForCausalLM from text_config and the "
            "language_model.* tensors (strict), eyrie/target/wrapped.py",
        }
        return target

    def env(self) -> dict:
        env = super().env()
        env[PROCESSOR_ENV] = PROCESSOR_PACKAGE
        return env

    def controls(self) -> dict:
        from .kimi_controls import broken_hooks, no_delegation

        results = Path(self.config["results"])
        out = {"no_delegation": no_delegation(self, results)}
        if self.budget - (time.monotonic() - self.t0) < 110:  # a server start and 2 requests
            out["wrong_hook_path"] = {"skipped": "under 110 s of the time budget left"}
        else:
            out["wrong_hook_path"] = broken_hooks(self, results)
        (self.out / "negative.json").write_text(json.dumps(out, indent=1) + "\n")
        self.summary["negative"] = out
        return out


def _stopped(signum, frame):
    raise StepError("stopped by SIGTERM (the script's time limit)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/out/gpu-kimi")
    p.add_argument("--work", help="scratch folder (default: a new temporary one)")
    p.add_argument("--standin", action="store_true", help="CPU rehearsal with the stand-in")
    p.add_argument("--budget-s", type=float, default=320.0, help="time for all steps")
    p.add_argument(
        "--import-hook",
        action="store_true",
        help="also force the import-hook mechanism (one more server start, about 50 s)",
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="eyrie-kimi-"))
    work.mkdir(parents=True, exist_ok=True)
    run = KimiRun(out, work, args.standin, args.budget_s)

    def steps():
        target = run.step(f"build {TOY}", run.build_target)
        config = run.write_config(target)
        run.step("workflow extract + validate", run.workflow, config)
        hf = run.step("transformers extract (language model alone)", run.hf_extract)
        run.step("compare stores", run.compare, hf)
        run.step("negative controls", run.controls)
        if not args.import_hook:
            run.summary["import_hook_skipped"] = "not asked for (--import-hook)"
        elif args.standin:
            run.summary["import_hook_skipped"] = "the stand-in has no SGLang model module"
        else:
            run.step("import hook", run.import_hook)

    return finish(run, steps, "eyrie toy Kimi-K2.5 end to end")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stopped)  # the shell's time limit: still write the summary
    sys.exit(main())
