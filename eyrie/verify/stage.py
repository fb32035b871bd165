"""The verify_env stage: run the SGLang and/or transformers checks and decide pass or fail."""

from __future__ import annotations

import json
from pathlib import Path

from eyrie.common.atomic import write_text
from eyrie.verify.chain import ChainAnalyzer
from eyrie.verify.hf import check_hf, config_folder, read_config_json
from eyrie.verify.pyindex import SourceIndex
from eyrie.verify.registry import entry_classes, release_facts
from eyrie.verify.report import registry, release_json, render, verify_arch
from eyrie.verify.source import SglangSource, VerifyError, locate

_ANALYZERS: dict[str, tuple[ChainAnalyzer, object]] = {}
_REGISTRIES: dict[str, dict] = {}


def analyzer(source: SglangSource) -> tuple[ChainAnalyzer, object]:
    """The analyzer and release facts of a source, built once per process."""
    key = str(source.root.resolve())
    if key not in _ANALYZERS:
        index = SourceIndex(source.root)
        _ANALYZERS[key] = (ChainAnalyzer(index), release_facts(index, source.version))
    return _ANALYZERS[key]


def all_entries_of(source: SglangSource) -> dict:
    """Every EntryClass of a release (parses every model module once per process)."""
    key = str(source.root.resolve())
    if key not in _REGISTRIES:
        _REGISTRIES[key] = entry_classes(analyzer(source)[0].index)
    return _REGISTRIES[key]


def layer_count(config_json: dict) -> int | None:
    for cfg in (config_json, config_json.get("text_config") or {}):
        if isinstance(cfg.get("num_hidden_layers"), int):
            return cfg["num_hidden_layers"]
    return None


def architectures(config_json: dict | None, architecture: str | None) -> list[str]:
    if architecture:
        return [architecture]
    archs = (config_json or {}).get("architectures")
    if not archs or not all(isinstance(a, str) for a in archs):
        raise VerifyError(
            "the target's config.json has no 'architectures' list; set target.architecture "
            "(or pass --arch)"
        )
    return list(archs)


def check_sglang(
    sglang: str | SglangSource | None,
    archs: list[str],
    num_layers: int | None = None,
    aux_ids: list[int] | None = None,
    all_entries: bool = False,
) -> dict:
    source = sglang if isinstance(sglang, SglangSource) else locate(sglang)
    an, facts = analyzer(source)
    out = {"release": release_json(source, facts)}
    if all_entries:
        entries = all_entries_of(source)
        out["registry"] = registry(an, facts, entries)
    else:
        entries = entry_classes(an.index, set(archs))
    out["targets"] = [verify_arch(an, facts, entries, a, num_layers, aux_ids) for a in archs]
    return out


def failures(report: dict, strict: bool) -> list[str]:
    """Plain sentences for every verdict that fails the stage."""
    bad = []
    for check in report.get("sglang", []):
        for res in check.get("targets", []):
            if res["verdict"] == "unsupported" or (strict and res["verdict"] == "patchable"):
                extra = " (verify.strict is true)" if res["verdict"] == "patchable" else ""
                bad.append(
                    f"{res['architecture']} is {res['verdict']}{extra} in SGLang "
                    f"{check['release']['version']}: {res['why']} {res['patch']['sentence']}"
                )
            ids = res.get("layer_ids") or {}
            if ids.get("impossible"):
                bad.append(f"{res['architecture']}: {ids['error']}")
    return bad


def check_target_files(target: str | Path, architecture: str | None = None) -> None:
    """The workflow's cheap checks of the target folder, before any job loads it: weights,
    tokenizer and chat template present (file names only), and target.architecture one that
    config.json declares. A TargetError names the folder and the fix."""
    from eyrie.target.files import check_files, read_architecture

    folder = config_folder(target)
    check_files(folder)
    if architecture:
        read_architecture(folder, architecture)


def run_stage(
    target: str | Path | None,
    backend: str = "hf",
    aux_ids: list[int] | None = None,
    sglang: str | None = "installed",
    strict: bool = False,
    architecture: str | None = None,
    all_entries: bool = False,
) -> dict:
    """Build the whole report. Input problems raise VerifyError; verdicts land in "failures"."""
    if backend not in ("hf", "sglang"):
        raise VerifyError(f"capture.backend: {backend!r} is not allowed; use hf or sglang")
    report: dict = {"backend": backend, "strict": strict, "sglang": [], "hf": [], "notes": []}
    config_json = read_config_json(target) if target is not None else None
    if backend == "hf":
        if target is None:
            raise VerifyError("the transformers check needs the target's model folder")
        if architecture:  # transformers builds config.json's class: refuse another name
            from eyrie.target.files import read_architecture

            read_architecture(config_folder(target), architecture)
        report["hf"].append(check_hf(target, aux_ids))
    else:
        survey = all_entries and config_json is None and not architecture
        archs = [] if survey else architectures(config_json, architecture)
        layers = layer_count(config_json) if config_json else None
        ids = aux_ids
        if ids is None and layers is not None and layers >= 7:
            from eyrie.target.layers import default_aux_layer_ids

            ids = default_aux_layer_ids(layers)
        report["sglang"].append(check_sglang(sglang, archs, layers, ids, all_entries))
        if target is not None:
            try:
                report["hf"].append(check_hf(target, aux_ids))
            except VerifyError as exc:
                report["notes"].append(f"transformers check skipped: {exc}")
    report["failures"] = failures(report, strict)
    report["ok"] = not report["failures"]
    return report


def write_report(report: dict, json_path: str | Path | None, md_path: str | Path | None) -> None:
    if json_path:
        write_text(json_path, json.dumps(report, indent=2, default=str) + "\n")
    if md_path:
        write_text(md_path, render(report, markdown=True))
