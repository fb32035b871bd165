"""The evaluation settings (config section `evaluate`), typed once with the schema's defaults.

`evaluate_settings(config["evaluate"])` is what run_speculate and run_online read; the rules'
adapters and `eyrie speculate` build it the same way (the subcommand then replaces what its
command line gives, with dataclasses.replace).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eyrie.common.settings import typed


@dataclass(frozen=True)
class Baselines:
    probe_epochs: int
    probe_width: int


@dataclass(frozen=True)
class Serving:
    """evaluate.sglang: SGLang's own measurement."""

    launch_timeout_s: float
    server_args: list[str] | None
    cuda_graph: Any  # true, false or "both" (eyrie.evaluate.online.MODES)
    prompts: int | None
    settings: list[dict] | None


@dataclass(frozen=True)
class EvaluateSettings:
    steps: int | None
    batch_size: int
    draft_tokens: int
    topk: int
    verify_tokens: int | None
    prompts: int
    max_new_tokens: int
    device: str
    dtype: str
    repeats: int
    baselines: Baselines
    sglang: Serving

    @property
    def served_prompts(self) -> int:
        """The prompts SGLang serves: evaluate.sglang.prompts, else evaluate.prompts."""
        return self.sglang.prompts or self.prompts


def evaluate_settings(section: dict | None) -> EvaluateSettings:
    """The evaluate section's settings, the schema's defaults under what ``section`` gives."""
    return typed(EvaluateSettings, "evaluate", section)
