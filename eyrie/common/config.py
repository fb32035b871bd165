"""Load a workflow config outside Snakemake, with the same schema and defaults as the Snakefile.

A config file given to Snakemake with --configfile is merged over the Snakefile's own
`configfile: "config.yaml"`, so an override file holds only what differs (README, "Your own
model and data"); `merge` is Snakemake's merge, and `load(path, base)` applies it, as
`eyrie config` does over the config.yaml of the folder it runs in.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from eyrie.common.errors import EyrieError

SCHEMA_PATH = Path(str(resources.files("eyrie") / "schemas" / "config.schema.yaml"))
# The Snakefile's `configfile:`; Snakemake reads it relative to the folder it runs in.
WORKFLOW_CONFIG = Path("config.yaml")


class ConfigError(EyrieError, ValueError):
    """A config that does not match the schema; the message names each bad key."""


def schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "a mapping",
    "null": "null",
}


def allowed_words(sub: dict) -> str:
    """The values a schema node allows, in words: its `allowed` annotation, else its types
    ("a string or null", "a list of strings")."""
    if "allowed" in sub:
        return sub["allowed"]
    kinds = sub.get("type", [])
    words = []
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        if kind == "array":
            item = (sub.get("items") or {}).get("type")
            words.append(f"a list of {item}s" if isinstance(item, str) else "a list")
        else:
            words.append(_TYPE_WORDS.get(kind, kind))
    if not words:
        return "a valid value"
    return ", ".join(words[:-1]) + (" or " if len(words) > 1 else "") + words[-1]


def _describe(err: jsonschema.ValidationError) -> str:
    key = _key(err.absolute_path)
    if err.validator in ("pattern", "type"):
        return f"{key} must be {allowed_words(err.schema)}, got {err.instance!r}"
    if err.validator == "enum":
        return f"{key}: {err.instance!r} is not allowed; use one of {err.validator_value}"
    if err.validator == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        return f"{key}: unknown key(s) {extra}; allowed keys are {allowed}"
    if err.validator == "required":
        return f"{key}: {err.message}"
    return f"{key}: {err.message}"


def _with_defaults(node: Any, sch: dict) -> Any:
    """Fill schema defaults into nested objects, as Snakemake's validate(set_default=True) does."""
    if not isinstance(node, dict) or sch.get("type") != "object":
        return node
    for name, sub in sch.get("properties", {}).items():
        if name not in node and "default" in sub:
            node[name] = copy.deepcopy(sub["default"])
        if name in node:
            node[name] = _with_defaults(node[name], sub)
    return node


def check(config: dict) -> dict:
    """Validate against the schema (all errors at once) and return a copy with defaults filled."""
    sch = schema()
    validator = jsonschema.Draft202012Validator(sch)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = "\n".join(f"  - {_describe(e)}" for e in errors)
        raise ConfigError(f"invalid config:\n{lines}\nSee the README's config reference.")
    return _with_defaults(copy.deepcopy(config), sch)


def merge(base: dict, overlay: dict) -> dict:
    """`overlay` merged into `base` (changed in place, and returned) as Snakemake merges a
    --configfile over the Snakefile's configfile (snakemake.utils.update_config): a mapping is
    merged key by key, anything else (a list, null, a number) replaces what was there. Its
    corners too: an empty mapping leaves what was there, a mapping over a non-mapping replaces
    it."""
    for key, value in overlay.items():
        if not isinstance(base, Mapping):
            base = {}
        if isinstance(value, Mapping):
            base[key] = merge(base.get(key, {}), value)
        else:
            base[key] = value
    return base


def read(path: str | Path) -> dict:
    """The mapping a YAML config file holds, as written (no merge, no defaults)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"config file {path} must hold a mapping of keys, not {type(raw).__name__}"
        )
    return raw


def base_for(path: str | Path, base: str | Path | None = WORKFLOW_CONFIG) -> Path | None:
    """The file `path` is merged over: `base` when it exists and is another file, else None."""
    if base is None or not Path(base).is_file():
        return None
    if Path(path).is_file() and Path(path).resolve() == Path(base).resolve():
        return None
    return Path(base)


def load(path: str | Path, base: str | Path | None = None) -> dict:
    """A config file, checked and with every default filled in: on its own (`base` None, as
    the subcommands' --config reads a whole config), or merged over `base` as
    `snakemake --configfile PATH` merges it over the Snakefile's config.yaml (`eyrie config`)."""
    overlay = read(path)
    under = base_for(path, base)
    if under is not None:
        return check(merge(read(under), overlay))
    try:
        return check(overlay)
    except ConfigError as exc:
        if "required property" not in str(exc):
            raise
        if base is None:
            hint = (
                f"{path} is read as a whole config. For an override file holding only what "
                f"differs from the workflow's config.yaml, `eyrie config {path} > whole.yaml` "
                "(from the workflow's folder) writes it merged as Snakemake merges it; pass that."
            )
        else:
            hint = (
                f"There is no {base} here to merge {path} over: run from the workflow's folder, "
                "or give the config it overrides with --base FILE."
            )
        raise ConfigError(f"{exc}\n{hint}") from None


def config_hash(config: dict) -> str:
    """A stable hash of a config section, recorded as provenance in every output."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
