"""patch_server: turn verify_env's report into a patch bundle for an unmodified SGLang.

The bundle is a folder; nothing of the installed SGLang is touched:

    manifest.json                   what was verified and how capture is switched on (manifest.py)
    python/eyrie_sglang_patch/      SERVER_MODULES: the code the server runs
    python/sitecustomize.py         the import hook's entry point (import_hook only)
    launch.sh                       starts a patched server by hand (for an external server)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from eyrie.common.atomic import replace_folder
from eyrie.sglang.launch import launcher
from eyrie.sglang.patch import SERVER_MODULES
from eyrie.sglang.patch.finder import SITECUSTOMIZE
from eyrie.sglang.patch.hooks import hook_specs
from eyrie.sglang.patch.manifest import MANIFEST, build_manifest, load_report
from eyrie.sglang.patch.protocol import compare_files
from eyrie.sglang.patch.settings import PatchError, sglang_settings

PACKAGE = "eyrie_sglang_patch"


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
        replace_folder(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
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
    run = " ".join(launcher("python3"))
    cmd = f'exec {run} --model-path "$1" --host 127.0.0.1 --port "$2" {flags}'
    cmd += ' --forward-hooks "$hooks"' if hooks else ""
    lines.append(cmd + ' "${@:3}"')
    return "\n".join(lines) + "\n"
