"""Find the SGLang source to inspect: the installed package, a folder, or a release wheel.

Nothing here imports sglang. A release named as ``pip:X`` is fetched once as its wheel from PyPI
and unpacked into a cache folder, so later runs (and every test) read plain files.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from eyrie.common.cache import cache_root
from eyrie.common.errors import EyrieError

# Source files are all the check reads; the wheel's compiled extensions are left packed.
_UNPACK_SUFFIXES = (".py", "METADATA")
# Wheels of a release hold the same Python source on every platform; when pip finds no wheel
# for this interpreter (another OS, another Python), fetch the Linux CPython 3.11 one instead.
_FALLBACK_PLATFORM = ["--platform", "manylinux_2_34_x86_64", "--python-version", "3.11"]


class VerifyError(EyrieError, RuntimeError):
    """A problem with the inputs of the verify stage; the message says how to fix it."""


@dataclass(frozen=True)
class SglangSource:
    """Where the ``sglang`` package of one release lies on disk."""

    root: Path  # the folder that holds the ``sglang/`` package
    version: str
    origin: str  # "installed", "folder" or "pip"

    @property
    def package(self) -> Path:
        return self.root / "sglang"

    def describe(self) -> str:
        return f"sglang {self.version} ({self.origin}: {self.package})"


def read_version(package: Path) -> str:
    """The release's ``__version__`` from ``sglang/version.py``, read as text."""
    version_file = package / "version.py"
    if version_file.is_file():
        for node in ast.parse(version_file.read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
                and isinstance(node.value, ast.Constant)
            ):
                return str(node.value.value)
    for meta in sorted(package.parent.glob("sglang-*.dist-info/METADATA")):
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def _package_dir(folder: Path) -> Path | None:
    """The ``sglang`` package inside a folder, a site-packages or a source checkout."""
    for candidate in (folder, folder / "sglang", folder / "python" / "sglang"):
        if (candidate / "srt" / "models").is_dir() and candidate.name == "sglang":
            return candidate
    return None


def from_folder(folder: str | Path) -> SglangSource:
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise VerifyError(
            f"verify.sglang: folder {folder} does not exist; give a folder that holds the "
            "sglang package, 'installed', or 'pip:VERSION'"
        )
    package = _package_dir(folder)
    if package is None:
        raise VerifyError(
            f"verify.sglang: {folder} holds no sglang package (looked for sglang/srt/models "
            "in it, in sglang/ and in python/sglang/); point it at the folder above sglang/"
        )
    return SglangSource(package.parent, read_version(package), "folder")


def installed() -> SglangSource:
    """The sglang package of this Python, located without importing it."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise VerifyError(
            "sglang is not installed in this Python, so there is no source to inspect; "
            "pass --sglang pip:VERSION (e.g. pip:0.5.23, fetched from PyPI) or --sglang FOLDER "
            "(a folder holding the sglang package), or set verify.sglang in the config"
        )
    package = Path(list(spec.submodule_search_locations)[0])
    if not (package / "srt" / "models").is_dir():
        raise VerifyError(f"the installed sglang at {package} has no srt/models folder")
    return SglangSource(package.parent, read_version(package), "installed")


def _pip_download(version: str, dest: Path, extra: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", *extra, f"sglang=={version}", "-d", str(dest)]
    return subprocess.run(cmd, capture_output=True, text=True)


def _unpack(wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if member.endswith(_UNPACK_SUFFIXES) and ".." not in Path(member).parts:
                zf.extract(member, dest)


def fetch_release(version: str, cache: Path | None = None) -> SglangSource:
    """The source of ``sglang==version``, downloading and unpacking its wheel on first use.

    The release is unpacked in a temporary folder beside the final one and renamed into place,
    so an interrupted download never leaves a half-filled cache entry.
    """
    if not version or any(c in version for c in "/\\ <>=!~;"):
        raise VerifyError(f"verify.sglang: {version!r} is not a release number; use pip:0.5.23")
    final = (cache or cache_root() / "sglang") / version
    if _package_dir(final) is not None:
        return SglangSource(final, read_version(final / "sglang"), "pip")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=final.parent))
    try:
        wheels = tmp / "_wheel"
        done = _pip_download(version, wheels, [])
        if done.returncode != 0:
            done = _pip_download(version, wheels, _FALLBACK_PLATFORM)
        found = sorted(wheels.glob("sglang-*.whl"))
        if done.returncode != 0 or not found:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise VerifyError(
                f"could not download sglang=={version} from PyPI ({' '.join(tail)}); check the "
                "version (pip index versions sglang) and the network, or pass a folder instead"
            )
        _unpack(found[0], tmp)
        shutil.rmtree(wheels)
        if _package_dir(tmp) is None:
            raise VerifyError(f"the wheel of sglang=={version} holds no sglang/srt/models")
        try:
            os.replace(tmp, final)
        except OSError:
            if _package_dir(final) is None:  # not a concurrent fetch that won the race
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return SglangSource(final, read_version(final / "sglang"), "pip")


def locate(spec: str | None, cache: Path | None = None) -> SglangSource:
    """Resolve ``verify.sglang``: "installed" (or empty), "pip:VERSION", or a folder."""
    spec = (spec or "installed").strip()
    if spec == "installed":
        return installed()
    if spec.startswith("pip:"):
        return fetch_release(spec[4:].strip(), cache)
    return from_folder(spec)
