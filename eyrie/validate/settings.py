"""The validation settings (config section `validate`), typed once with the schema's defaults."""

from __future__ import annotations

from dataclasses import dataclass

from eyrie.common.settings import typed


@dataclass(frozen=True)
class ValidateSettings:
    max_errors: int  # the summary's limit (eyrie/validate/summary.py)
    min_greedy_match: float
    spot_check_samples: int
    min_cosine: float


def validate_settings(section: dict | None) -> ValidateSettings:
    """The validate section's settings, the schema's defaults under what ``section`` gives."""
    return typed(ValidateSettings, "validate", section)
