"""Negative controls for the wrapper chain: capture deliberately not passed through the wrapper.

A capture that silently misses its layers is the failure Eyrie exists to prevent, so the toy
Kimi-K2.5 run (tests/e2e/kimi_e2e.py) also checks that breaking the chain is caught:

(a) `no_delegation`: a copy of the verified SGLang source (Python files only) in which
    `KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture` no longer passes the call on to
    `self.language_model`. verify must stop calling the chain `ok` and cite the setter's file:line;
    with verify.strict the stage refuses it; otherwise the patch stage must switch capture on at
    the inner model (`model.language_model`), and a bundle made from the copy must be refused on
    the real installation (its files differ from the verified ones).
(b) `broken_hooks`: a live server whose `--forward-hooks` name the plain causal LM's modules
    (`model.layers.i`, `model.norm`), which the wrapper does not have. The extraction must fail
    with an error that names the cause, and store nothing.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

KIMI_FILE = "sglang/srt/models/kimi_k25.py"
DELEGATION = re.compile(
    r"^(\s*)self\.language_model\.set_eagle3_layers_to_capture\(layer_ids\)\s*$"
)


def _error_type():
    from .harness import StepError

    return StepError


def citations(obj, file: str) -> list[str]:
    """Every "file:line (what)" a verify result cites in `file`, in order, without repeats."""
    out: list[str] = []
    if isinstance(obj, dict):
        if obj.get("file") == file and "line" in obj:
            out.append(f"{file}:{obj['line']} ({obj.get('what', '')})")
        for value in obj.values():
            out += citations(value, file)
    elif isinstance(obj, list):
        for value in obj:
            out += citations(value, file)
    return list(dict.fromkeys(out))


def remove_delegation(source_pkg: Path, dest: Path) -> str:
    """Copy the Python files of `source_pkg` (a folder named sglang, and its dist-info METADATA
    for the release number) to dest, with the wrapper's one delegation line replaced by `pass`;
    returns "file:line" of the removed line."""
    copy = dest / "sglang"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(
        source_pkg,
        copy,
        ignore=lambda d, names: [
            n for n in names if not (n.endswith(".py") or (Path(d) / n).is_dir())
        ],
    )
    for meta in source_pkg.parent.glob("sglang-*.dist-info/METADATA"):  # the release number
        (dest / meta.parent.name).mkdir(exist_ok=True)
        shutil.copy2(meta, dest / meta.parent.name / "METADATA")
    path = dest / KIMI_FILE
    lines = path.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if DELEGATION.match(line)]
    if len(hits) != 1:
        raise _error_type()(
            f"{source_pkg.parent / KIMI_FILE}: expected one line passing "
            f"set_eagle3_layers_to_capture to self.language_model, found {len(hits)}; this "
            "control is written for SGLang releases whose wrapper delegates (0.5.12, 0.5.23)"
        )
    indent = DELEGATION.match(lines[hits[0]]).group(1)
    lines[hits[0]] = f"{indent}pass  # delegation removed by Eyrie's negative control\n"
    path.write_text("".join(lines))
    return f"{KIMI_FILE}:{hits[0] + 1}"


def no_delegation(run, results: Path) -> dict:
    """Control (a); the facts for the summary. Raises StepError when a check does not hold."""
    from eyrie.sglang.patch.bundle import check_installed
    from eyrie.sglang.patch.manifest import build_manifest
    from eyrie.sglang.patch.settings import PatchError
    from eyrie.verify.stage import run_stage

    StepError = _error_type()
    manifest = json.loads((results / "patch" / "manifest.json").read_text())
    installed = Path(manifest["sglang"]["source"])
    removed = remove_delegation(installed, run.work / "sglang-no-delegation")
    target, aux = run.config["target"]["path"], run.config["capture"].get("aux_layer_ids")
    copy = str(run.work / "sglang-no-delegation")
    report = run_stage(target, "sglang", aux, sglang=copy, strict=False)
    strict = run_stage(target, "sglang", aux, sglang=copy, strict=True)
    res = report["sglang"][0]["targets"][0]
    if res["verdict"] == "ok":
        raise StepError(f"verify still calls the chain ok without its delegation: {res['why']}")
    if not strict["failures"]:
        raise StepError("verify.strict accepted a wrapper that does not pass the capture on")
    cites = citations(res, KIMI_FILE)
    out = {
        "removed": removed,
        "verdict": res["verdict"],
        "why": res["why"],
        "kimi_file_lines": cites,
        "strict_failure": strict["failures"][0],
    }
    if res["verdict"] == "patchable":
        path = run.work / "no-delegation-report.json"
        path.write_text(json.dumps(report, default=str))
        m = build_manifest(report, report_path=path, aux_layer_ids=aux)
        if m["call_on"] != "model.language_model":
            raise StepError(f"the patch would switch capture on at {m['call_on']!r}")
        out["patch"] = (
            f"capture switched on at {m['call_on']} ({m['mechanism']}); hooks on "
            f"{m['hook_modules']['aux']}"
        )
        try:
            check_installed(m, installed)
        except PatchError as exc:
            out["installed_check"] = f"refused: {exc}"
        else:
            raise StepError("a bundle verified on the modified copy passed the installed check")
    else:
        out["patch"] = "none: the stage stops (unsupported)"
        out["installed_check"] = "not reached"
    return out


def broken_hooks(run, results: Path, samples: int = 2) -> dict:
    """Control (b): a server hooked at the plain causal LM's module names must not capture."""
    from eyrie.extract.sglang import SglangError
    from eyrie.sglang.patch.bundle import build_bundle

    from .harness import _samples, served

    StepError = _error_type()
    bundle = run.work / "patch-wrong-path"
    manifest = build_bundle(results / "verify" / "report.json", bundle)
    if manifest["mechanism"] != "forward_hooks":
        return {"skipped": f"mechanism {manifest['mechanism']}: no hook paths to break"}
    modules = manifest["hook_modules"]
    wrong = {
        k: [re.sub(r"^language_model\.", "", n) for n in v]
        if isinstance(v, list)
        else re.sub(r"^language_model\.", "", v)
        for k, v in modules.items()
    }
    manifest["hook_modules"] = wrong
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    picked = _samples(results / "store" / "train" / "shard-000.zarr")[:samples]
    sg = run.config["capture"]["sglang"]
    saved = sg.get("dump_timeout_s")
    sg["dump_timeout_s"] = 5
    error = None
    try:
        with served(run, "wrong-path", bundle, manifest) as send:
            try:
                got = send(picked, "neg-")
            except SglangError as exc:
                error = str(exc)
            else:
                raise StepError(
                    f"hooks on {wrong['aux']} (not modules of the wrapper) still gave "
                    f"{len(got)} captures: a silent store"
                )
    finally:
        if saved is None:
            sg.pop("dump_timeout_s", None)
        else:
            sg["dump_timeout_s"] = saved
    log = run.work / "logs" / "wrong-path.log"
    unmatched = [
        ln.strip()[-200:]
        for ln in log.read_text(errors="replace").splitlines()
        if "No modules matched" in ln
    ][:4]
    if "captured nothing" not in error:
        raise StepError(f"the extraction failed, but not for the hooks: {error}")
    return {"hooked": wrong["aux"], "error": error[:600], "server_log": unmatched}
