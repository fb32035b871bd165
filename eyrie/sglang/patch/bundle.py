"""patch_server: turn verify_env's report into a patch bundle for an unmodified SGLang.

The bundle is a folder; nothing of the installed SGLang is touched:

    manifest.json                   what was verified and how capture is switched on
    python/eyrie_sglang_patch/      dump.py, hooks.py, finder.py: the code the server runs
    python/sitecustomize.py         the import hook's entry point (import_hook only)
    launch.sh                       starts a patched server by hand (for an external server)

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

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from eyrie.common.errors import EyrieError
from eyrie.sglang.patch import SERVER_MODULES
from eyrie.sglang.patch.dump import compare_files, sha256_file
from eyrie.sglang.patch.finder import SITECUSTOMIZE
from eyrie.sglang.patch.hooks import hook_specs

PATCH_VERSION = 1
MANIFEST = "manifest.json"
PACKAGE = "eyrie_sglang_patch"
MECHANISMS = ("auto", "forward_hooks", "import_hook")
DEFAULT_DUMP_ROOT = "/dev/shm"
FORWARD_BATCH = "sglang/srt/model_executor/forward_batch_info.py"
SCHEDULE_BATCH = "sglang/srt/managers/schedule_batch.py"
HOOK_MANAGER = "sglang/srt/model_executor/hook_manager.py"
VERSION_FILE = "sglang/version.py"
# Flags every capture server gets, when the release defines them: token ids in and out; no
# prefix cache (a cached prefix is never computed, so its states would be missing); eager
# execution (module hooks do not run inside CUDA graphs or compiled regions); all-reduces not
# fused into the next layer (a layer's output must be complete on every tensor-parallel rank).
REQUIRED_FLAGS = (
    "skip_tokenizer_init",
    "disable_radix_cache",
    "disable_cuda_graph",
    "disable_piecewise_cuda_graph",
    "enforce_disable_flashinfer_allreduce_fusion",
)

# The schema's defaults (eyrie/schemas/config.schema.yaml, capture.sglang), for direct callers.
DEFAULTS = {
    "url": None,
    "bundle": None,
    "mechanism": "auto",
    "python": None,
    "launcher": None,
    "server_args": None,
    "tp": 1,
    "chunked_prefill_size": None,
    "dtype": "bfloat16",
    "concurrency": 8,
    "launch_timeout_s": 900,
    "request_timeout_s": 600,
    "dump_timeout_s": 60,
    "dump_root": DEFAULT_DUMP_ROOT,
    "dump_dir": None,
    "max_dump_bytes": 8 << 30,
    "rid_prefix": "eyrie-",
    "log_dir": None,
}


class PatchError(EyrieError, RuntimeError):
    """The bundle cannot be built or used; the message names the input and the fix."""


def sglang_settings(capture: dict) -> dict:
    """capture.sglang with defaults filled; unknown keys are refused."""
    given = dict(capture.get("sglang") or {})
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise PatchError(f"capture.sglang: unknown key(s) {unknown}; allowed: {sorted(DEFAULTS)}")
    return {**DEFAULTS, **{k: v for k, v in given.items() if v is not None}}


def bundle_from_config(report_path, out_dir, capture: dict) -> dict:
    """build_bundle with the settings of a workflow config's capture section."""
    s = sglang_settings(capture)
    return build_bundle(
        report_path,
        out_dir,
        aux_layer_ids=capture.get("aux_layer_ids"),
        mechanism=s["mechanism"],
        dump_dir=s["dump_dir"],
        dump_root=s["dump_root"],
        rid_prefix=s["rid_prefix"],
    )


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


# ---------------------------------------------------------------------------------------------
# facts read from the verified source


def _evidence(root: Path, rel: str, line: int, what: str) -> dict:
    text = (root / rel).read_text(errors="replace").splitlines()[line - 1].strip()
    return {"what": what, "file": rel, "line": line, "text": text}


def class_field(root: Path, rel: str, cls: str, name: str) -> dict | None:
    """Where class `cls` of file `rel` declares field `name` (an annotated class attribute)."""
    path = root / rel
    if not path.is_file():
        return None
    for node in ast.walk(ast.parse(path.read_text(errors="replace"))):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if (
                    isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and item.target.id == name
                ):
                    return _evidence(root, rel, item.lineno, f"{cls}.{name}")
    return None


def self_attributes(root: Path, rel: str, cls: str, names: tuple[str, ...]) -> dict[str, dict]:
    """Where class `cls` assigns self.<name> (in any method), for each of `names`."""
    found: dict[str, dict] = {}
    path = root / rel
    if not path.is_file():
        return found
    for node in ast.walk(ast.parse(path.read_text(errors="replace"))):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for sub in ast.walk(node):
                targets = sub.targets if isinstance(sub, ast.Assign) else []
                if isinstance(sub, ast.AnnAssign):
                    targets = [sub.target]
                flat = []
                for t in targets:
                    flat += list(t.elts) if isinstance(t, ast.Tuple | ast.List) else [t]
                for t in flat:
                    if (
                        isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                        and t.attr in names
                        and t.attr not in found
                    ):
                        what = f"{cls} sets self.{t.attr}"
                        found[t.attr] = _evidence(root, rel, sub.lineno, what)
    return found


def server_flags(root: Path) -> dict[str, dict | None]:
    """Which of REQUIRED_FLAGS the release defines (server_args.py or arg_groups/ fields)."""
    files = [root / "sglang/srt/server_args.py"]
    files += sorted((root / "sglang/srt/arg_groups").rglob("*.py"))
    out: dict[str, dict | None] = dict.fromkeys(REQUIRED_FLAGS)
    for path in files:
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = re.match(r"\s+(\w+)\s*:", line)
            if m and m.group(1) in out and out[m.group(1)] is None:
                out[m.group(1)] = {
                    "what": f"option --{m.group(1).replace('_', '-')}",
                    "file": rel,
                    "line": no,
                    "text": line.strip(),
                }
    return out


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


# ---------------------------------------------------------------------------------------------
# the bundle


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
            "files": {f: sha256_file(root / f) for f in sorted(files)},
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


def build_bundle(report_path: str | Path, out_dir: str | Path, **kwargs) -> dict:
    """Write the bundle folder (atomically: a temporary folder renamed into place)."""
    report_path, out_dir = Path(report_path), Path(out_dir)
    manifest = build_manifest(load_report(report_path), report_path=report_path, **kwargs)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        pkg = tmp / "python" / PACKAGE
        pkg.mkdir(parents=True)
        here = resources.files("eyrie.sglang.patch")
        code = {}
        for name in SERVER_MODULES:
            text = here.joinpath(name).read_text()
            (pkg / name).write_text(text)
            code[f"python/{PACKAGE}/{name}"] = hashlib.sha256(text.encode()).hexdigest()
        (pkg / "__init__.py").write_text('"""Eyrie\'s capture patch, as run inside SGLang."""\n')
        if manifest["mechanism"] == "import_hook":
            (tmp / "python" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        manifest["code"] = code
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        launch = tmp / "launch.sh"
        launch.write_text(launch_script(manifest))
        launch.chmod(0o755)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return manifest


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
        if not (Path(bundle) / rel).is_file() or sha256_file(Path(bundle) / rel) != digest
    ]
    if changed:
        raise PatchError(f"{bundle}: bundled files changed since patch_server: {changed}")
    return manifest


# ---------------------------------------------------------------------------------------------
# using a bundle


def server_env(bundle: str | Path, manifest: dict, dump_dir, rid_prefix, base=None) -> dict:
    """The environment of a patched server: the bundle first on PYTHONPATH (+ import hook vars)."""
    env = dict(os.environ if base is None else base)
    python = str(Path(bundle).resolve() / "python")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (python, env.get("PYTHONPATH", "")) if p)
    if manifest["mechanism"] == "import_hook":
        env["EYRIE_PATCH_MANIFEST"] = str(Path(bundle).resolve() / MANIFEST)
        env["EYRIE_PATCH_DUMP_DIR"] = str(dump_dir)
        env["EYRIE_PATCH_RID_PREFIX"] = rid_prefix
    return env


def server_args(bundle: str | Path, manifest: dict, dump_dir, rid_prefix) -> list[str]:
    """Flags the patch needs on the launch command line."""
    args = list(manifest["server_flags"])
    if manifest["mechanism"] == "forward_hooks":
        specs = hook_specs(
            manifest, str(Path(bundle).resolve() / MANIFEST), str(dump_dir), rid_prefix
        )
        args += ["--forward-hooks", json.dumps(specs)]
    return args


def installed_package(python: str, env: dict | None = None) -> Path:
    """The sglang package folder the given interpreter imports (found without importing it)."""
    code = (
        "import importlib.util as u; s = u.find_spec('sglang'); "
        "print(list(s.submodule_search_locations)[0] if s else '')"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    folder = done.stdout.strip()
    if done.returncode != 0 or not folder:
        raise PatchError(
            f"{python} cannot import sglang (PYTHONPATH={(env or os.environ).get('PYTHONPATH')})"
            f"{': ' + done.stderr.strip()[-300:] if done.stderr.strip() else ''}; install the "
            "SGLang release that verify_env checked"
        )
    return Path(folder)


def check_installed(manifest: dict, package: Path) -> None:
    """Refuse an SGLang whose files differ from what the bundle was verified against."""
    bad = compare_files(Path(package).parent, manifest["sglang"]["files"])
    if bad:
        shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        raise PatchError(
            f"the SGLang at {package} is not the one verified (SGLang "
            f"{manifest['sglang']['version']} from {manifest['sglang']['source']}): {shown}. "
            "Rerun verify_env and patch_server against this installation"
        )


def launch_script(manifest: dict) -> str:
    """launch.sh: start a patched server by hand, e.g. as the external server of an extraction."""
    flags = " ".join(manifest["server_flags"])
    dump = manifest.get("dump_dir") or f"{manifest['dump_root']}/eyrie-dump-$(id -u)"
    hooks = manifest["mechanism"] == "forward_hooks"
    lines = [
        "#!/usr/bin/env bash",
        f"# SGLang {manifest['sglang']['version']} with Eyrie's capture patch "
        f"({manifest['mechanism']}). Written by patch_server.",
        "# usage: launch.sh MODEL_DIR PORT [more launch_server flags]",
        "# The extraction must use the same dump folder: capture.sglang.dump_dir.",
        "set -euo pipefail",
        'here=$(cd "$(dirname "$0")" && pwd)',
        f'dump="${{EYRIE_PATCH_DUMP_DIR:-{dump}}}"',
        'prefix="${EYRIE_PATCH_RID_PREFIX:-' + manifest["rid_prefix"] + '}"',
        'mkdir -p -m 700 "$dump"',
        'export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"',
    ]
    if hooks:
        lines.append(
            'hooks=$(python3 -m eyrie_sglang_patch.hooks "$here/manifest.json" "$dump" "$prefix")'
        )
    else:
        lines.append(
            'export EYRIE_PATCH_MANIFEST="$here/manifest.json" EYRIE_PATCH_DUMP_DIR="$dump" '
            'EYRIE_PATCH_RID_PREFIX="$prefix"'
        )
    cmd = (
        'exec python3 -m sglang.launch_server --model-path "$1" --host 127.0.0.1 --port "$2" '
        f"{flags}"
    )
    cmd += ' --forward-hooks "$hooks"' if hooks else ""
    lines.append(cmd + ' "${@:3}"')
    return "\n".join(lines) + "\n"
