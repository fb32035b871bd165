"""Load a workflow config outside Snakemake, with the same schema and defaults as the Snakefile."""

from __future__ import annotations

import copy
import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from eyrie.common.errors import EyrieError

SCHEMA_PATH = Path(str(resources.files("eyrie") / "schemas" / "config.schema.yaml"))


class ConfigError(EyrieError, ValueError):
    """A config that does not match the schema; the message names each bad key."""


def schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def _describe(err: jsonschema.ValidationError) -> str:
    key = _key(err.absolute_path)
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


def load(path: str | Path) -> dict:
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
    return check(raw)


def config_hash(config: dict) -> str:
    """A stable hash of a config section, recorded as provenance in every output."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
