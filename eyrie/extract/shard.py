"""Extract one shard of one split: the extract stage's entry point, for either backend.

capture.backend picks the capture: `hf` runs the target in-process (eyrie.extract.hf), `sglang`
sends the samples to a patched SGLang server (eyrie.extract.sglang). The job around it (scratch
store, commit groups, resume, errors table, lock, disk-full handling) is eyrie.extract.job.
"""

from __future__ import annotations

from pathlib import Path

from eyrie.extract.job import Outcome, run_shard, work_paths
from eyrie.extract.split import (
    ExtractError,
    Interrupted,
    Record,
    read_split,
    resolve_aux_layer_ids,
    shard_members,
)
from eyrie.extract.table import ERROR_COLUMNS, read_errors, write_errors

__all__ = [
    "ERROR_COLUMNS",
    "ExtractError",
    "Interrupted",
    "Outcome",
    "Record",
    "extract_shard",
    "read_errors",
    "read_split",
    "resolve_aux_layer_ids",
    "shard_members",
    "work_paths",
    "write_errors",
]


def extract_shard(
    *,
    data_path: str | Path,
    target_path: str | Path,
    split: str,
    shard: int,
    out_store: str | Path,
    errors_csv: str | Path,
    capture: dict,
    extract: dict,
    max_tokens: int,
    architecture: str | None = None,
    commit_every: int = 64,
    weights_cache: str | Path | None = None,
    stop_after_commits: int | None = None,
    progress: bool = True,
    target=None,
    writer_queue: int = 1,
) -> Outcome:
    """Extract shard `shard` of extract.shards from a split file into `out_store`.

    `target` may hold the already loaded eyrie.target.load.Target of `target_path` (to run several
    shards, or a benchmark, with one model); by default the target is loaded here (the SGLang
    backend only takes its tokenizer). With the transformers backend, compression, checksums and
    commits run on a writer thread while the next group is captured, with at most
    `writer_queue` captured groups waiting for it; 0 writes on this thread. The SGLang backend
    writes as the dumps arrive.
    """
    backend = capture.get("backend", "hf")
    if backend == "sglang":
        from eyrie.extract.sglang import SglangBackend

        cap = SglangBackend(
            capture,
            split=split,
            shard=shard,
            out_store=out_store,
            errors_csv=errors_csv,
            architecture=architecture,
            target=target,
        )
    elif backend == "hf":
        from eyrie.extract.hf import HFBackend

        cap = HFBackend(
            capture, architecture=architecture, target=target, writer_queue=writer_queue
        )
    else:
        raise ExtractError(
            f"capture.backend {backend!r}: this extractor runs the target in-process (backend 'hf')"
        )
    return run_shard(
        cap,
        data_path=data_path,
        target_path=target_path,
        split=split,
        shard=shard,
        out_store=out_store,
        errors_csv=errors_csv,
        capture_cfg=capture,
        extract=extract,
        max_tokens=max_tokens,
        commit_every=commit_every,
        weights_cache=weights_cache,
        stop_after_commits=stop_after_commits,
        progress=progress,
    )
