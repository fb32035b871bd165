"""The capture and extract settings (config sections `capture`, `extract`), typed once with the
schema's defaults.

An extract job (eyrie.extract.shard.ShardTask) keeps the two sections as given, which is what a
store's provenance records; it reads them through these objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from eyrie.common.settings import typed


@dataclass(frozen=True)
class CaptureSettings:
    backend: str
    aux_layer_ids: list[int] | None
    device: str
    batch_size: int
    cuda_graphs: bool | str
    graph_bucket_tokens: int
    sglang: dict  # as given: the SGLang backend reads it (eyrie.sglang.patch.settings)


@dataclass(frozen=True)
class ExtractSettings:
    shards: int
    chunk_tokens: int
    shard_tokens: int | str
    precision: str
    writer_threads: int | str
    writer_process: bool | str
    pin_forward: bool | str


def capture_settings(section: dict | None) -> CaptureSettings:
    """The capture section's settings, the schema's defaults under what ``section`` gives."""
    return typed(CaptureSettings, "capture", section)


def extract_settings(section: dict | None) -> ExtractSettings:
    """The extract section's settings, the schema's defaults under what ``section`` gives."""
    return typed(ExtractSettings, "extract", section)
