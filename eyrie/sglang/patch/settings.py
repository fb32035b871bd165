"""capture.sglang, with the schema's defaults filled in for callers outside the workflow."""

from __future__ import annotations

import functools

from eyrie.common.config import schema
from eyrie.common.errors import EyrieError

DEFAULT_DUMP_ROOT = "/dev/shm"


class PatchError(EyrieError, RuntimeError):
    """The bundle cannot be built or used; the message names the input and the fix."""


@functools.cache
def defaults() -> dict:
    """The schema's defaults of capture.sglang (eyrie/schemas/config.schema.yaml)."""
    keys = schema()["properties"]["capture"]["properties"]["sglang"]["properties"]
    return {name: spec.get("default") for name, spec in keys.items()}


def sglang_settings(capture: dict) -> dict:
    """capture.sglang with defaults filled; unknown keys are refused."""
    given = dict(capture.get("sglang") or {})
    known = defaults()
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise PatchError(f"capture.sglang: unknown key(s) {unknown}; allowed: {sorted(known)}")
    return {**known, **{k: v for k, v in given.items() if v is not None}}
