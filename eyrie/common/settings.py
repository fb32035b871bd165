"""A config section as a typed, frozen settings object, its defaults the schema's own.

`typed(cls, "evaluate", config["evaluate"])` fills the schema's defaults
(eyrie/schemas/config.schema.yaml) under what the config gives, refuses a key the schema lacks
by name, and builds ``cls`` (a frozen dataclass whose fields are the section's keys; a field
typed with another such dataclass is built the same way from its subsection). A stage reads its
settings once from it instead of a default and a conversion at each use. The trainer's own
settings stay in eyrie/train/settings.py, whose code is part of a drafter's provenance.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Mapping
from functools import cache

from eyrie.common.config import ConfigError, _with_defaults, schema


@cache
def _section(path: str) -> dict:
    node = schema()
    for name in path.split("."):
        node = node["properties"][name]
    return node


def typed(cls, path: str, values: Mapping | None):
    """``cls`` from the defaults of section ``path`` overlaid with ``values``."""
    known = _section(path)["properties"]
    given = dict(values or {})
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; allowed keys are {sorted(known)}")
    merged = _with_defaults(copy.deepcopy(given), _section(path))
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[field.name]):  # a subsection: its own defaults
            value = typed(hints[field.name], f"{path}.{field.name}", merged.get(field.name))
        else:
            value = merged[field.name]
        kwargs[field.name] = value
    return cls(**kwargs)
