"""The pieces of an extract job (eyrie.extract.shard) that do not depend on the backend.

The job is the same for every backend; only the capture differs (`Capture`: eyrie.extract.hf
runs the target in-process, eyrie.extract.sglang sends the samples to a patched server).

Work happens in a scratch store, `<store parent>/.work/<store name>`, moved into place only once
finished. Snakemake deletes a job's outputs before it reruns the job, so a store written in place
would be lost on every rerun; the scratch store survives a kill and the rerun resumes it.

Resume is bit-exact: the samples that tokenize cleanly are cut into fixed commit groups, and each
group is captured in the same batches (by length, within the group) whether or not the job was
interrupted before it. A group is committed as a whole, then the errors table is rewritten.
Samples that cannot be extracted are listed in the errors table, never dropped silently (see
eyrie.data.errors_table). Samples cut at dataset.max_tokens are stored (cut) and counted in the log
and the outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from eyrie.common import atomic
from eyrie.common.config import config_hash
from eyrie.common.errors import ExtractError
from eyrie.common.progress import bar as progress_bar
from eyrie.common.provenance import file_sha256
from eyrie.data.errors_table import read_errors, write_errors
from eyrie.extract.tokens import TokenizedSample

log = logging.getLogger("eyrie.extract.shard")

WORK_DIR = ".work"

# A capture result per sample: (aux (T, k, H), final (T, H)), or ("error", reason, detail) for a
# sample the backend refused (it is listed in the errors table).
Resolve = Callable[[], list]


@dataclass
class Outcome:
    store: Path
    errors_csv: Path
    samples: int = 0
    tokens: int = 0
    errors: dict = field(default_factory=dict)
    truncated: int = 0  # samples cut at dataset.max_tokens (stored cut)
    tokens_cut: int = 0  # the tokens those cuts dropped
    seconds: dict = field(default_factory=dict)  # setup, capture, write, ..., total (this run)


@dataclass
class Prepared:
    """What a backend knows of the target once it is ready to capture."""

    tokenizer: object
    architecture: str
    device: torch.device
    dtype: torch.dtype
    hidden_size: int
    settings: dict = field(default_factory=dict)  # backend keys added to the provenance settings
    dtype_label: str | None = None  # provenance "dtype" when it is not the torch dtype's name


class Capture(Protocol):
    """A backend of the extract job (eyrie.extract.hf.HFBackend, eyrie.extract.sglang)."""

    backend: str  # provenance "backend"
    label: str  # added to the progress bar's description
    seconds_keys: tuple[str, ...]  # the outcome's timings
    writer_queue: int  # groups waiting for the writer thread; 0 writes on the job's thread
    # (eyrie.extract.writing picks the store's writer from it)

    def prepare(self, target_path, aux_ids: list[int]) -> Prepared:
        """Check the backend against the target and load what tokenizing needs."""

    def session(self, todo: bool, batch_size: int):
        """A context manager yielding submit(group) -> Resolve; `todo` is False when every
        group is already committed (a backend may then start nothing)."""

    def finish(self, outcome: Outcome) -> None:
        """Add the backend's own figures to the outcome, once the store is in place."""


# ---------------------------------------------------------------------------------------------
# the scratch store and its plan


def work_paths(store: str | Path, errors_csv: str | Path) -> tuple[Path, Path]:
    store, errors_csv = Path(store), Path(errors_csv)
    work = store.parent / WORK_DIR
    return work / store.name, work / errors_csv.name


def groups_to_do(
    good: list[TokenizedSample], size: int, committed: set[str], failed: set[int]
) -> list:
    """Commit groups still to do, each as it was in the first attempt (same batches).

    `failed` holds the lines that failed at capture in an earlier attempt.
    """
    todo = []
    for start in range(0, len(good), size):
        group = good[start : start + size]
        if not any(g.sample_id in committed for g in group):
            todo.append(group)
            continue
        # A committed group: its other samples failed at capture; redo any not yet listed.
        left = [g for g in group if g.sample_id not in committed and g.line not in failed]
        if left:
            todo.append(left)
    return todo


def batches(group: list[TokenizedSample], batch_size: int) -> list[list[int]]:
    """Indices of a group's samples in batches, longest first (ties in group order)."""
    order = sorted(range(len(group)), key=lambda i: (-len(group[i].input_ids), i))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def layout(group: list[TokenizedSample], batch_size: int) -> list[list[int]]:
    """A group's batches as the capture runs them, each as its samples' token counts (what a
    writer process sizes the shared memory the group is captured into by)."""
    return [[len(group[i].input_ids) for i in batch] for batch in batches(group, batch_size)]


def provenance_for(
    target_path,
    *,
    backend: str,
    split: str,
    shard: int,
    shards: int,
    data_path,
    settings: dict,
    device: torch.device,
    dtype: torch.dtype,
    weights_cache=None,
) -> dict:
    from eyrie.target.load import package_versions, tokenizer_sha256, weights_sha256

    return {
        "backend": backend,
        "target_path": str(target_path),
        "weights_sha256": weights_sha256(target_path, weights_cache),
        "tokenizer_sha256": tokenizer_sha256(target_path),
        "data_path": str(data_path),
        "data_sha256": file_sha256(data_path),
        "split": split,
        "shard": shard,
        "shards": shards,
        "device": device.type,
        "dtype": str(dtype).removeprefix("torch."),
        "config_hash": config_hash(settings),
        "settings": settings,
        "packages": package_versions(),
    }


def resume_plan(
    writer, work_store, work_errors, good, errors, members, commit_every, *, desc, progress
):
    """What is left to capture after the last commit, and a progress bar that starts there.

    Failures recorded for groups that were not committed are kept (``errors`` is updated);
    a finished store with samples left over means the scratch folder is inconsistent.
    """
    committed = set(writer.committed_ids)
    if committed:
        log.info("resuming %s: %d samples already committed", work_store, len(committed))
    # Capture failures of committed groups (tokenization errors are found again anyway);
    # a fresh store ignores a table left by an earlier setup.
    good_lines = {g.line for g in good}
    old = read_errors(work_errors) if committed else {}
    for line, row in old.items():
        if line in good_lines and row[0] not in committed:
            errors[line] = row
    groups = groups_to_do(good, commit_every, committed, set(errors))
    if writer.complete and groups:
        raise ExtractError(
            f"{work_store} is finished but {sum(map(len, groups))} samples are neither in "
            f"it nor in {work_errors}; delete {work_store.parent} and rerun"
        )
    bar = progress_bar(
        total=len(members),
        initial=len(committed) + len(errors),
        unit="sample",
        desc=desc,
        disable=not progress,
        mininterval=2.0,
    )
    return groups, bar


def place_store(work_store, work_errors, out_store, errors_csv, errors, sources) -> None:
    """Put a finished scratch store and its errors table in place.

    The table is copied, not moved, until the store is in place: a job killed between the two
    steps is rerun by Snakemake, which resumes the finished scratch store and its table.
    """
    write_errors(work_errors, errors, sources)
    atomic.copy(work_errors, errors_csv)
    atomic.replace_folder(work_store, out_store)
    work_errors.unlink()


def count_cuts(
    outcome: Outcome, good: list[TokenizedSample], errors: dict, max_tokens: int
) -> None:
    """Count (and log) the stored samples that were cut at dataset.max_tokens."""
    cut = [g for g in good if g.full_length > len(g.input_ids) and g.line not in errors]
    outcome.truncated = len(cut)
    outcome.tokens_cut = sum(g.full_length - len(g.input_ids) for g in cut)
    if cut:
        log.warning(
            "%s: %d samples were cut at dataset.max_tokens (%d), dropping %d tokens (the "
            "longest had %d); raise dataset.max_tokens to keep them whole",
            outcome.store,
            len(cut),
            max_tokens,
            outcome.tokens_cut,
            max(g.full_length for g in cut),
        )
