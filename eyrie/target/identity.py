"""What a target folder is, by content: the sha256 of every file that decides what it computes.

The identity lists the config, weights, tokenizer and code files of the folder with their sizes
and digests, and no times: it changes exactly when a file's content does, so a `touch` or a copy
that keeps the bytes changes nothing. Digests are cached by (path, size, mtime), so a folder
whose files were not rewritten is not read again and the identity is cheap to recompute on every
start of the workflow; the stores' weights digest comes from the same cache.

The workflow keeps it in {results}/target/identity.json, rewritten only when it changes, and
every rule that reads the target takes that file as input: new weights under an unchanged
config.json rerun what depends on them, an untouched target reruns nothing (rules/common.smk).

This module imports no torch: the workflow runs it while it parses the Snakefile.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from eyrie.common.atomic import write_json
from eyrie.common.provenance import file_sha256
from eyrie.target.files import KEY, TOKENIZER_FILES, TargetError, weight_files

# Files of a target folder that decide what it computes; the rest (README, training logs,
# images) may change without a rerun.
CONFIG_FILES = ("config.json", "generation_config.json")
PATTERNS = ("*.safetensors", "*.safetensors.index.json", "*.py", "*.model", "*.tiktoken")
Say = Callable[[str], None] | None  # where a note on slow hashing goes
# Hashing this much at once gets a line saying why the start is slow.
LOUD_BYTES = 1 << 30


def identity_files(folder: str | Path) -> list[Path]:
    """The files of the folder the identity covers, sorted by name."""
    folder = Path(folder)
    found = {folder / n for n in (*CONFIG_FILES, *TOKENIZER_FILES)}
    for pattern in PATTERNS:
        found.update(folder.glob(pattern))
    return sorted((p for p in found if p.is_file()), key=lambda p: p.name)


def _cache_key(path: Path) -> tuple[str, str]:
    st = path.stat()
    resolved = str(path.resolve())
    return resolved, f"{resolved}:{st.st_size}:{st.st_mtime_ns}"


def file_digests(
    files: list[Path], cache_file: str | Path | None = None, say: Say = None
) -> dict[Path, str]:
    """sha256 of each file, read only when (path, size, mtime) is not in the cache file.

    The cache keeps one entry per path (a rewritten file's old entry is dropped) and is written
    atomically, only when it changed.
    """
    cache: dict[str, str] = {}
    if cache_file and Path(cache_file).is_file():
        try:
            cache = json.loads(Path(cache_file).read_text())
        except (OSError, json.JSONDecodeError):
            cache = {}  # a cache is only ever a shortcut: rebuild it
    keys = {f: _cache_key(f) for f in files}
    todo = [f for f, (_, key) in keys.items() if key not in cache]
    size = sum(f.stat().st_size for f in todo)
    if say and size >= LOUD_BYTES:
        say(
            f"hashing {len(todo)} files of {todo[0].parent} ({size / 1e9:.1f} GB) that are new "
            "or were rewritten since they were last hashed"
        )
    for f in todo:
        resolved, key = keys[f]
        cache = {k: v for k, v in cache.items() if k.rsplit(":", 2)[0] != resolved}
        cache[key] = file_sha256(f)
    if cache_file and todo:
        write_json(cache_file, cache)
    return {f: cache[key] for f, (_, key) in keys.items()}


def _combined(names_digests: list[tuple[str, str]]) -> str:
    outer = hashlib.sha256()
    for name, digest in names_digests:
        outer.update(f"{name}:{digest}\n".encode())
    return outer.hexdigest()


def weights_sha256(path: str | Path, cache_file: str | Path | None = None) -> str:
    """One digest for all safetensors files of the folder (hundreds of GB: pass a cache file)."""
    files = weight_files(path)
    digests = file_digests(files, cache_file)
    return _combined([(f.name, digests[f]) for f in files])


def tokenizer_sha256(path: str | Path) -> str:
    files = [Path(path) / n for n in TOKENIZER_FILES if (Path(path) / n).is_file()]
    if not files:
        raise TargetError(f"{KEY}: {path} holds no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    digests = file_digests(files)
    return _combined([(f.name, digests[f]) for f in files])


def target_identity(
    folder: str | Path, cache_file: str | Path | None = None, say: Say = None
) -> dict:
    """{"sha256": one digest, "files": {name: {"bytes", "sha256"}}} of the folder's files."""
    files = identity_files(folder)
    digests = file_digests(files, cache_file, say)
    listed = {f.name: {"bytes": f.stat().st_size, "sha256": digests[f]} for f in files}
    return {"sha256": _combined([(n, d["sha256"]) for n, d in listed.items()]), "files": listed}


def update_identity(
    folder: str | Path,
    out: str | Path,
    cache_file: str | Path | None = None,
    say: Say = None,
) -> bool:
    """Write the folder's identity to `out` when it differs from what `out` holds; True if it
    was written. An unchanged identity leaves `out` alone, mtime included: rules that take it as
    input compare that mtime with their outputs'."""
    identity = target_identity(folder, cache_file, say)
    out = Path(out)
    try:
        if json.loads(out.read_text()) == identity:
            return False
    except (OSError, json.JSONDecodeError):
        pass
    write_json(out, identity)
    return True
