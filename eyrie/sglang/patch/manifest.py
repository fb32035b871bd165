"""The patch bundle's manifest: what was verified, and how capture is switched on.

Two mechanisms, chosen from the verified source:
- `forward_hooks`: SGLang's own `--forward-hooks` option registers Eyrie's torch forward hooks on
  decoder layer 0, the aux layers and the final norm of the layers' holder. Used when the release
  has the option AND its ForwardBatch carries `rids`, so states can be tied to requests.
- `import_hook`: a `sys.meta_path` finder on PYTHONPATH (sitecustomize) that switches on SGLang's
  own aux capture (`set_eagle3_layers_to_capture` on `patch.call_on`) as the model is built, and
  adds `rids` to the ForwardBatch where the release lacks them (0.5.9). Used otherwise.

The manifest records the sha256 of every SGLang file the verdict and the mechanism rest on; the
extraction re-hashes them (before launching, and again inside the server) and refuses a
different installation.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from eyrie.common.provenance import file_sha256
from eyrie.sglang.patch.settings import DEFAULT_DUMP_ROOT, PatchError
from eyrie.verify.facts import (
    FORWARD_BATCH,
    HOOK_MANAGER,
    REQUIRED_FLAGS,
    SCHEDULE_BATCH,
    VERSION_FILE,
    class_field,
    self_attributes,
    server_flags,
)

PATCH_VERSION = 1
MANIFEST = "manifest.json"
MECHANISMS = ("auto", "forward_hooks", "import_hook")


# ---------------------------------------------------------------------------------------------
# the report


def load_report(path: str | Path) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PatchError(f"verify report {path} does not exist; run the verify_env rule") from None
    except json.JSONDecodeError as exc:
        raise PatchError(f"verify report {path} is not JSON ({exc}); rerun verify_env") from None


def select_target(report: dict, path="the verify report") -> tuple[dict, dict]:
    """The SGLang check and the first target whose verdict can be captured."""
    checks = report.get("sglang") or []
    if not checks:
        raise PatchError(
            f"{path} has no SGLang check (backend {report.get('backend')!r}); set "
            "capture.backend: sglang and rerun verify_env"
        )
    check = checks[0]
    for target in check.get("targets", []):
        if target.get("verdict") in ("ok", "patchable"):
            return check, target
    verdicts = {t.get("architecture"): t.get("verdict") for t in check.get("targets", [])}
    raise PatchError(
        f"{path}: no target SGLang can capture ({verdicts}); use capture.backend: hf or another "
        "SGLang release"
    )


def relative(path: str | None) -> str:
    """An attribute path from SGLang's runner (`model...`) as a path from the model object."""
    if not path or path == "model":
        return ""
    if not path.startswith("model."):
        raise PatchError(f"attribute path {path!r} does not start at the top-level model")
    return path[len("model.") :]


def cited_files(obj) -> set[str]:
    """Every source file a report cites ({'file': ..., 'line': ...} anywhere in it)."""
    out: set[str] = set()
    if isinstance(obj, dict):
        if isinstance(obj.get("file"), str) and "line" in obj:
            out.add(obj["file"])
        for value in obj.values():
            out |= cited_files(value)
    elif isinstance(obj, list):
        for value in obj:
            out |= cited_files(value)
    return out


def module_name(rel_file: str) -> str:
    return rel_file.removesuffix(".py").replace("/", ".")


def holder_of(target: dict) -> tuple[str, dict]:
    """(class name, definition evidence) of the module whose forward runs the decoder layers."""
    for level in target.get("chain", []):
        if level.get("path") == target.get("layers_holder"):
            return level["class"], level["defined"]
    raise PatchError(
        f"the verify report names {target.get('layers_holder')} as the layers' holder but its "
        "chain has no such level; rerun verify_env"
    )


def choose_mechanism(requested: str, facts: dict, version: str) -> tuple[str, str]:
    """The mechanism and the sentence saying why, from what the release has."""
    if requested not in MECHANISMS:
        raise PatchError(f"capture.sglang.mechanism: {requested!r} is not one of {MECHANISMS}")
    hooks, rids, reqs = facts["forward_hooks"], facts["rids"], facts["reqs"]
    holder_ok = "layers" in facts["holder_attributes"] and "norm" in facts["holder_attributes"]
    cite = lambda e: f"{e['file']}:{e['line']}"  # noqa: E731
    if requested in ("auto", "forward_hooks") and hooks and rids and holder_ok:
        return "forward_hooks", (
            f"SGLang {version} has --forward-hooks ({cite(hooks[0])}) and its ForwardBatch "
            f"carries each request's rid ({cite(rids)}): SGLang registers Eyrie's hooks itself, "
            "and no module of it is patched"
        )
    if requested == "forward_hooks":
        why = "it has no --forward-hooks" if not hooks else "its ForwardBatch has no rids"
        if hooks and rids and not holder_ok:
            why = "the layers' holder has no self.layers and self.norm to hook"
        raise PatchError(
            f"capture.sglang.mechanism is forward_hooks but SGLang {version} cannot use it: "
            f"{why}; set it to import_hook or auto"
        )
    if not (rids or reqs):
        raise PatchError(
            f"SGLang {version}: neither ForwardBatch.rids nor ModelWorkerBatch.reqs exists, so "
            "captured states cannot be tied to requests; use capture.backend: hf"
        )
    if requested == "import_hook":
        return "import_hook", "capture.sglang.mechanism asks for the import hook"
    if not hooks:
        reason = "has no --forward-hooks option"
    elif not rids:
        reason = "has --forward-hooks, but its ForwardBatch carries no rids"
    else:
        reason = "has --forward-hooks, but the layers' holder has no self.layers/self.norm"
    extra = f"; rids are added from ModelWorkerBatch.reqs ({cite(reqs)})" if not rids else ""
    return "import_hook", (
        f"SGLang {version} {reason}: an import hook switches on SGLang's own aux capture as the "
        f"model is built{extra}"
    )


def _package_root(check: dict, source: str | Path | None) -> Path:
    """The folder above sglang/ holding the verified source."""
    package = Path(source) if source else Path(check["release"]["source"])
    if package.name != "sglang":
        package = package / "sglang"
    if not (package / "srt" / "models").is_dir():
        raise PatchError(
            f"the verified SGLang source {package} is gone; rerun verify_env in this "
            "environment (the bundle hashes the files it was verified against)"
        )
    return package.parent


def build_manifest(
    report: dict,
    *,
    report_path: str | Path,
    aux_layer_ids: list[int] | None = None,
    mechanism: str = "auto",
    dump_dir: str | None = None,
    dump_root: str = DEFAULT_DUMP_ROOT,
    rid_prefix: str = "eyrie-",
    source: str | Path | None = None,
) -> dict:
    """The manifest for a report (nothing written)."""
    check, target = select_target(report, report_path)
    root = _package_root(check, source)
    version = check["release"]["version"]
    ids = target.get("layer_ids") or {}
    if not ids.get("aux_ids") or ids.get("pass_to_sglang") is None:
        raise PatchError(
            f"{report_path}: no aux layer ids for {target['architecture']} "
            f"({ids.get('error', 'none were given')}); set capture.aux_layer_ids and rerun "
            "verify_env"
        )
    if aux_layer_ids is not None and list(aux_layer_ids) != list(ids["aux_ids"]):
        raise PatchError(
            f"{report_path} was made for aux ids {ids['aux_ids']}, the config asks for "
            f"{list(aux_layer_ids)}; rerun verify_env"
        )
    if not rid_prefix or any(c.isspace() for c in rid_prefix):
        raise PatchError(f"capture.sglang.rid_prefix {rid_prefix!r} must be non-empty, no spaces")
    holder_cls, holder_def = holder_of(target)
    facts = {
        "forward_hooks": check["release"]["forward_hooks"]["evidence"]
        if check["release"]["forward_hooks"]["available"]
        else [],
        "rids": class_field(root, FORWARD_BATCH, "ForwardBatch", "rids"),
        "reqs": class_field(root, SCHEDULE_BATCH, "ModelWorkerBatch", "reqs"),
        "holder_attributes": self_attributes(
            root, holder_def["file"], holder_cls, ("layers", "norm")
        ),
        "flags": server_flags(root),
    }
    chosen, why = choose_mechanism(mechanism, facts, version)
    holder = relative(target["layers_holder"])
    dot = f"{holder}." if holder else ""
    aux = [int(i) for i in ids["aux_ids"]]
    top_file = target["chain"][0]["defined"]["file"]
    files = cited_files(check["release"]) | cited_files(target) | cited_files(facts)
    files |= {FORWARD_BATCH, VERSION_FILE, top_file, holder_def["file"]}
    if chosen == "forward_hooks":
        files.add(HOOK_MANAGER)
    else:
        files.add(SCHEDULE_BATCH)
    files = {f for f in files if (root / f).is_file()}
    return {
        "eyrie_patch_version": PATCH_VERSION,
        "report": {"path": str(report_path), "sha256": _sha_json(report)},
        "sglang": {
            "version": version,
            "source": str(root / "sglang"),
            "files": {f: file_sha256(root / f) for f in sorted(files)},
        },
        "architecture": target["architecture"],
        "class": target["class"],
        "verdict": target["verdict"],
        "call_on": target["patch"]["call_on"],
        "layers_holder": target["layers_holder"],
        "mechanism": chosen,
        "mechanism_why": why,
        "evidence": facts,
        "aux_layer_ids": aux,
        "pass_to_sglang": [int(i) for i in ids["pass_to_sglang"]],
        "layers_to_capture": [i + 1 for i in aux],
        "hook_modules": {
            "start": f"{dot}layers.0",
            "aux": [f"{dot}layers.{i}" for i in aux],
            "final": f"{dot}norm",
        },
        "import_hook": {
            "module": module_name(top_file),
            "class": target["class"],
            "call_on": relative(target["patch"]["call_on"]),
            "holder": holder,
            "add_rids": facts["rids"] is None,
        },
        "server_flags": [
            f"--{name.replace('_', '-')}" for name in REQUIRED_FLAGS if facts["flags"][name]
        ],
        "dump_dir": dump_dir,
        "dump_root": dump_root,
        "rid_prefix": rid_prefix,
    }


def _sha_json(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def load_manifest(bundle: str | Path) -> dict:
    path = Path(bundle) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise PatchError(f"{path} does not exist; run the patch_server rule") from None
    except json.JSONDecodeError as exc:
        raise PatchError(f"{path} is not JSON ({exc}); rerun patch_server") from None
    if manifest.get("eyrie_patch_version") != PATCH_VERSION:
        raise PatchError(f"{path} is a bundle of another Eyrie version; rerun patch_server")
    changed = [
        rel
        for rel, digest in manifest.get("code", {}).items()
        if not (Path(bundle) / rel).is_file() or file_sha256(Path(bundle) / rel) != digest
    ]
    if changed:
        raise PatchError(f"{bundle}: bundled files changed since patch_server: {changed}")
    return manifest
