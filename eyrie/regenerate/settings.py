"""The regeneration settings (config section `regenerate`), typed once with the schema's
defaults. regenerate_split keeps the section as given for its summary and reads it through
these objects; `enabled` is the workflow's switch, no setting of a run."""

from __future__ import annotations

from dataclasses import dataclass

from eyrie.common.settings import typed


@dataclass(frozen=True)
class Serving:
    """regenerate.sglang: the server the sglang backend starts, or the one at its url."""

    url: str | None
    launch_timeout_s: float
    server_args: list[str] | None


@dataclass(frozen=True)
class RegenerateSettings:
    backend: str
    device: str
    temperature: float
    max_new_tokens: int
    batch_size: int
    chunk: int
    seed: int
    sglang: Serving


def regenerate_settings(section: dict | None) -> RegenerateSettings:
    """The regenerate section's settings, the schema's defaults under what ``section`` gives."""
    return typed(RegenerateSettings, "regenerate", section)
