"""Extract one shard of one split: tokenize, capture, and append to a shard store.

Shard membership is round-robin: sample j of the split (its j-th non-blank line, 0-based) is in
shard j % S. It is deterministic, needs no pass over lengths, and spreads long and short samples
evenly when the data is sorted by source or size.

Work happens in a scratch store, `<store parent>/.work/<store name>`, moved into place only once
finished. Snakemake deletes a job's outputs before it reruns the job, so a store written in place
would be lost on every rerun; the scratch store survives a kill and the rerun resumes it.

Resume is bit-exact: the samples that tokenize cleanly are cut into fixed commit groups, and each
group is captured in the same batches (by length, within the group) whether or not the job was
interrupted before it. A group is committed as a whole, then the errors table is rewritten.
Samples that cannot be extracted are listed in the errors table (sample_id, line, source,
reason, detail), never dropped silently; the table is keyed by the line of the split file, so a
resumed run never lists one twice, and a repeated id is listed as such instead of overwriting the
first. `source` is the sample's FILE:LINE in the user's dataset, as prepare_dataset recorded it.
Samples cut at dataset.max_tokens are stored (cut) and counted in the log and the outcome.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from eyrie.common import atomic
from eyrie.common.config import config_hash
from eyrie.common.disk_full import for_extract, is_disk_full
from eyrie.common.errors import EyrieError
from eyrie.data.chat_tokens import SampleError, tokenize_chat
from eyrie.store.background import start_writer
from eyrie.store.lock import StoreLock
from eyrie.store.shard import ShardReader, ShardWriter, StoreError

log = logging.getLogger("eyrie.extract.shard")

ERROR_COLUMNS = ("sample_id", "line", "source", "reason", "detail")
WORK_DIR = ".work"


class ExtractError(EyrieError, RuntimeError):
    """Extraction cannot start or go on; the message names the input and the fix."""


class Interrupted(RuntimeError):
    """Raised by `stop_after_commits`, to test resume."""


@dataclass
class Record:
    line: int  # 1-based line of the split file
    sample_id: str
    messages: list | None
    error: tuple[str, str] | None = None  # (reason, detail) when the line is unusable
    source: str = ""  # "FILE:LINE" of the user's file (prepare_dataset), else of the split file


@dataclass
class Good:
    line: int
    sample_id: str
    input_ids: np.ndarray
    loss_mask: np.ndarray
    full_length: int = 0  # tokens before the cut at dataset.max_tokens


@dataclass
class Outcome:
    store: Path
    errors_csv: Path
    samples: int = 0
    tokens: int = 0
    errors: dict = field(default_factory=dict)
    truncated: int = 0  # samples cut at dataset.max_tokens (stored cut)
    tokens_cut: int = 0  # the tokens those cuts dropped
    seconds: dict = field(default_factory=dict)  # setup, capture, write, wait, total (this run)


# ---------------------------------------------------------------------------------------------
# inputs


def read_split(path: str | Path) -> list[Record]:
    """Every line of a split file as a Record; a repeated id or a bad line is an error record."""
    path = Path(path)
    if not path.is_file():
        raise ExtractError(f"split file {path} does not exist; run the prepare_dataset rule")
    records, seen = [], {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            where = f"{path}:{n + 1}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                bad = ("bad_line", str(exc))
                records.append(Record(n + 1, f"line:{n + 1}", None, bad, where))
                continue
            sid, msgs = obj.get("id") if isinstance(obj, dict) else None, None
            if isinstance(obj, dict):
                msgs = obj.get("messages")
                src = obj.get("source")
                where = src if isinstance(src, str) and src else where
            if not isinstance(sid, str) or not sid:
                records.append(Record(n + 1, f"line:{n + 1}", None, ("bad_line", "no id"), where))
                continue
            rec = Record(n + 1, sid, msgs, source=where)
            if sid in seen:
                rec.error = ("duplicate_id", f"{where} repeats the id of line {seen[sid]}")
            elif not isinstance(msgs, list) or not msgs:
                rec.error = ("bad_line", f"{where} has no 'messages' list")
            else:
                seen[sid] = n + 1
            records.append(rec)
    return records


def shard_members(records: list, shard: int, shards: int) -> list:
    """The records of one shard: sample j (j-th non-blank line) with j % shards == shard."""
    if not 0 <= shard < shards:
        raise ExtractError(f"shard {shard} is out of range for extract.shards = {shards}")
    return [r for j, r in enumerate(records) if j % shards == shard]


def resolve_aux_layer_ids(configured, num_layers: int) -> list[int]:
    from eyrie.target.layers import check_aux_layer_ids, default_aux_layer_ids

    try:
        ids = list(configured) if configured else list(default_aux_layer_ids(num_layers))
        check_aux_layer_ids(ids, num_layers)
    except ValueError as exc:
        raise ExtractError(f"capture.aux_layer_ids: {exc}") from None
    return [int(i) for i in ids]


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# paths and the errors table


def work_paths(store: str | Path, errors_csv: str | Path) -> tuple[Path, Path]:
    store, errors_csv = Path(store), Path(errors_csv)
    work = store.parent / WORK_DIR
    return work / store.name, work / errors_csv.name


def read_errors(path: str | Path) -> dict[int, tuple[str, str, str]]:
    """line -> (sample_id, reason, detail) of an errors table; {} when there is none."""
    path = Path(path)
    if not path.is_file():
        return {}
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return {int(r["line"]): (r["sample_id"], r["reason"], r["detail"]) for r in rows}


def write_errors(
    path: str | Path, errors: dict[int, tuple[str, str, str]], sources: dict | None = None
) -> None:
    """Rewrite the whole table (in line order) under a temp name, then rename it into place.

    `sources` maps a split-file line to its "FILE:LINE" in the user's file (column source)."""
    sources = sources or {}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(ERROR_COLUMNS)
            for line in sorted(errors):
                sid, reason, detail = errors[line]
                w.writerow((sid, line, sources.get(line, ""), reason, detail))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# extraction


def _tokenize(tokenizer, members: list[Record], max_tokens: int):
    good, errors = [], {}
    for rec in members:
        if rec.error:
            errors[rec.line] = (rec.sample_id, *rec.error)
            continue
        try:
            t = tokenize_chat(tokenizer, rec.messages, max_tokens)
        except SampleError as exc:
            errors[rec.line] = (rec.sample_id, exc.reason, exc.detail)
            continue
        good.append(Good(rec.line, rec.sample_id, t.input_ids, t.loss_mask, t.full_length))
    return good, errors


def _groups(good: list[Good], size: int, committed: set[str], failed: set[int]) -> list:
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


def _batches(group: list[Good], batch_size: int) -> list[list[int]]:
    order = sorted(range(len(group)), key=lambda i: (-len(group[i].input_ids), i))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _open_writer(path: Path, provenance: dict, *, lock: StoreLock, **kwargs) -> ShardWriter:
    """Resume a scratch store, or start it again when it was begun with another setup.

    `lock` must be held for `path`: a store another process writes is never looked at here.
    """
    if not (lock.held and lock.store == path):
        raise ExtractError(f"{path}: opening a scratch store needs its lock held")
    if path.exists():
        try:
            old = ShardReader(path, require_complete=False).attrs.get("provenance")
        except StoreError as exc:
            log.warning("scratch store %s is unusable (%s); starting it again", path, exc)
            old = None
        normal = json.loads(json.dumps(provenance))
        if old != normal:
            log.warning("scratch store %s was begun with another setup; starting again", path)
            shutil.rmtree(path)
    return ShardWriter(path, provenance=provenance, lock=lock, **kwargs)


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
    groups = _groups(good, commit_every, committed, set(errors))
    if writer.complete and groups:
        raise ExtractError(
            f"{work_store} is finished but {sum(map(len, groups))} samples are neither in "
            f"it nor in {work_errors}; delete {work_store.parent} and rerun"
        )
    bar = tqdm(
        total=len(members),
        initial=len(committed) + len(errors),
        unit="sample",
        desc=desc,
        disable=not progress,
        mininterval=2.0,
    )
    return groups, bar


def place_store(work_store, work_errors, out_store, errors_csv, errors, sources) -> None:
    """Put a finished scratch store and its errors table in place (both backends).

    The table is copied, not moved, until the store is in place: a job killed between the two
    steps is rerun by Snakemake, which resumes the finished scratch store and its table.
    """
    write_errors(work_errors, errors, sources)
    atomic.copy(work_errors, errors_csv)
    atomic.replace_folder(work_store, out_store)
    work_errors.unlink()


def close_outcome(outcome, work_store, errors, good, max_tokens, seconds, start) -> None:
    """The outcome's error counts, cuts and timings, once the store is in place."""
    with contextlib.suppress(OSError):
        work_store.parent.rmdir()  # only when empty
    outcome.errors = _count(errors)
    count_cuts(outcome, good, errors, max_tokens)
    seconds["total"] = time.perf_counter() - start
    outcome.seconds = seconds


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
    shards, or a benchmark, with one model); by default the target is loaded here.
    Compression, checksums and commits run on a writer thread while the next group is captured,
    with at most `writer_queue` captured groups waiting for it; 0 writes on this thread.
    """
    if capture.get("backend", "hf") == "sglang":  # a served target: eyrie/extract/sglang.py
        args = dict(locals())
        args.pop("writer_queue")  # the SGLang path writes as the dumps arrive
        from eyrie.extract.sglang import extract_shard_sglang

        return extract_shard_sglang(**args)
    from eyrie.extract.hf import HFCapture
    from eyrie.target.load import load_target, num_hidden_layers

    if capture.get("backend", "hf") != "hf":
        raise ExtractError(
            f"capture.backend {capture.get('backend')!r}: this extractor runs the target "
            "in-process (backend 'hf')"
        )
    start = time.perf_counter()
    seconds = dict.fromkeys(("setup", "capture", "write", "wait", "total"), 0.0)
    shards = int(extract["shards"])
    batch_size = int(capture.get("batch_size", 8))
    commit_every = max(batch_size, -(-int(commit_every) // batch_size) * batch_size)
    out_store, errors_csv = Path(out_store), Path(errors_csv)
    work_store, work_errors = work_paths(out_store, errors_csv)

    members = shard_members(read_split(data_path), shard, shards)
    aux_ids = resolve_aux_layer_ids(capture.get("aux_layer_ids"), num_hidden_layers(target_path))
    if target is None:
        target = load_target(
            target_path, device=capture.get("device", "auto"), architecture=architecture
        )
    good, errors = _tokenize(target.tokenizer, members, max_tokens)
    sources = {r.line: r.source for r in members}
    settings = {
        "capture": {**capture, "aux_layer_ids": aux_ids},
        "extract": dict(extract),
        "max_tokens": int(max_tokens),
        "commit_every": commit_every,
        "architecture": target.architecture,
    }
    provenance = provenance_for(
        target_path,
        backend="hf",
        split=split,
        shard=shard,
        shards=shards,
        data_path=data_path,
        settings=settings,
        device=target.device,
        dtype=target.dtype,
        weights_cache=weights_cache,
    )
    hidden = int(target.model.config.get_text_config().hidden_size)
    # Locked before the scratch store is looked at; held until the store is in place.
    lock = StoreLock(work_store).acquire()
    writer = None
    try:
        writer = _open_writer(
            work_store,
            provenance,
            lock=lock,
            hidden_size=hidden,
            aux_layer_ids=aux_ids,
            chunk_tokens=int(extract.get("chunk_tokens", 256)),
            shard_tokens=int(extract.get("shard_tokens", 16384)),
            precision=str(extract.get("precision", "lossless")),
        )
        try:
            groups, bar = resume_plan(
                writer,
                work_store,
                work_errors,
                good,
                errors,
                members,
                commit_every,
                desc=f"extract {split}/{shard:03d}",
                progress=progress,
            )
            t0, commits, done = time.monotonic(), 0, {"tokens": 0}
            seconds["setup"] = time.perf_counter() - start

            def write_group(group, captured):  # on the writer thread (eyrie/store/background.py)
                tick = time.perf_counter()
                results = {
                    i: out
                    for batch, pending in captured
                    for i, out in zip(batch, pending.result(), strict=True)
                }
                for i, g in enumerate(group):
                    aux, final = results[i]
                    if not (torch.isfinite(aux).all() and torch.isfinite(final).all()):
                        errors[g.line] = (g.sample_id, "non_finite", "the target gave NaN or Inf")
                        continue
                    errors.pop(g.line, None)
                    writer.append(g.sample_id, g.input_ids, g.loss_mask, aux, final)
                    done["tokens"] += len(g.input_ids)
                writer.commit()
                write_errors(work_errors, errors, sources)
                seconds["write"] += time.perf_counter() - tick

            pad_id = target.tokenizer.pad_token_id
            with (
                start_writer(writer_queue) as bg,
                HFCapture(target.model, aux_ids, pad_token_id=pad_id) as cap,
            ):
                for group in groups:
                    tick = time.perf_counter()
                    captured = [
                        (batch, cap.capture_pending([group[i].input_ids for i in batch]))
                        for batch in _batches(group, batch_size)
                    ]
                    seconds["capture"] += time.perf_counter() - tick
                    bg.submit(write_group, group, captured)  # commits in order, off this thread
                    commits += 1
                    bar.update(len(group))
                    rate = done["tokens"] / max(time.monotonic() - t0, 1e-9)
                    bar.set_postfix(tok_s=f"{rate:.0f}")
                    if stop_after_commits is not None and commits >= stop_after_commits:
                        bg.wait()  # the commits asked for are on disk
                        raise Interrupted(f"stopped after {commits} commits (as asked)")
            seconds["wait"] = bg.waited_s
            bar.close()
            writer.finish()
            outcome = Outcome(out_store, errors_csv, writer.num_samples, writer.num_tokens)
        finally:
            writer.close()
        place_store(work_store, work_errors, out_store, errors_csv, errors, sources)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        raise ExtractError(
            for_extract(work_store, out_store, writer, good, aux_ids, hidden)
        ) from exc
    finally:
        lock.release()
    close_outcome(outcome, work_store, errors, good, max_tokens, seconds, start)
    log.info(
        "%s: %d samples, %d tokens, %d errors %s",
        out_store,
        outcome.samples,
        outcome.tokens,
        len(errors),
        outcome.errors,
    )
    return outcome


def count_cuts(outcome: Outcome, good: list[Good], errors: dict, max_tokens: int) -> None:
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


def _count(errors: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, reason, _ in errors.values():
        counts[reason] = counts.get(reason, 0) + 1
    return counts
