"""Extract one shard of one split: tokenize, capture, and append to a shard store.

capture.backend picks the capture (eyrie.extract.job.Capture): `hf` runs the target in-process
(eyrie.extract.hf), `sglang` sends the samples to a patched SGLang server (eyrie.extract.sglang).
Everything around it exists once, here and in eyrie.extract.job: the scratch store and its lock,
commit groups and bit-exact resume, the errors table, disk-full handling, the outcome.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from pathlib import Path

from eyrie.common.disk_full import for_extract, is_disk_full
from eyrie.extract.cpus import forward_cpu_plan, forward_pinned
from eyrie.extract.job import (
    Outcome,
    Resolve,
    count_cuts,
    open_writer,
    place_store,
    provenance_for,
    resume_plan,
    work_paths,
)
from eyrie.extract.split import (
    ExtractError,
    Interrupted,
    Record,
    read_split,
    resolve_aux_layer_ids,
    shard_members,
    tokenize,
)
from eyrie.extract.table import ERROR_COLUMNS, count_reasons, read_errors, write_errors
from eyrie.extract.write_process import WriterProcess, store_group, use_writer_process
from eyrie.store.background import start_writer
from eyrie.store.codecs import shard_tokens_for
from eyrie.store.lock import StoreLock
from eyrie.store.writer import SHARD_ENCODER

log = logging.getLogger("eyrie.extract.shard")
# extract settings that change only speed: left out of a store's provenance (shard_encoder is
# not in the config schema: benchmarks/bench_extract.py sets it to compare the two writers)
WRITER_KNOBS = ("writer_threads", "writer_process", "shard_encoder", "pin_forward")
# capture.sglang settings that say how to reach and wait on the server, not what it computes:
# left out of the provenance too, so that a rerun after a server's fault resumes the store with
# a restarted server (a new url) or a lower concurrency instead of starting it again
SERVER_KNOBS = (
    "url",
    "dump_dir",
    "dump_root",
    "log_dir",
    "concurrency",
    "max_dump_bytes",
    "launch_timeout_s",
    "request_timeout_s",
    "dump_timeout_s",
    "health_timeout_s",
)

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


def stored_capture(capture: dict, aux_ids: list[int]) -> dict:
    """The capture settings a store's provenance records (SERVER_KNOBS left out)."""
    out = {**capture, "aux_layer_ids": aux_ids}
    if isinstance(out.get("sglang"), dict):
        out["sglang"] = {k: v for k, v in out["sglang"].items() if k not in SERVER_KNOBS}
    return out


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
    from eyrie.target.load import num_hidden_layers

    start = time.perf_counter()
    seconds = dict.fromkeys(cap.seconds_keys, 0.0)
    shards = int(extract["shards"])
    batch_size = int(capture.get("batch_size", 8))
    commit_every = max(batch_size, -(-int(commit_every) // batch_size) * batch_size)
    out_store, errors_csv = Path(out_store), Path(errors_csv)
    work_store, work_errors = work_paths(out_store, errors_csv)

    members = shard_members(read_split(data_path), shard, shards)
    aux_ids = resolve_aux_layer_ids(capture.get("aux_layer_ids"), num_hidden_layers(target_path))
    ready = cap.prepare(target_path, aux_ids)
    child = None  # the writer process, started now: it imports while the job tokenizes
    if cap.writer_queue > 0 and use_writer_process(
        extract.get("writer_process", "auto"), ready.device.type, cap.backend
    ):
        child = WriterProcess()
    try:
        pin_plan = forward_cpu_plan(
            extract.get("pin_forward", "auto"),
            writer_process=child is not None,
            device_type=ready.device.type,
        )
        good, errors = tokenize(ready.tokenizer, members, max_tokens)
        sources = {r.line: r.source for r in members}
        settings = {
            "capture": stored_capture(capture, aux_ids),
            # how fast the writer goes is no part of what the store holds (nor a reason to restart)
            "extract": {k: v for k, v in extract.items() if k not in WRITER_KNOBS},
            "max_tokens": int(max_tokens),
            "commit_every": commit_every,
            "architecture": ready.architecture,
            **ready.settings,
        }
        provenance = provenance_for(
            target_path,
            backend=cap.backend,
            split=split,
            shard=shard,
            shards=shards,
            data_path=data_path,
            settings=settings,
            device=ready.device,
            dtype=ready.dtype,
            weights_cache=weights_cache,
        )
        if ready.dtype_label is not None:
            provenance["dtype"] = ready.dtype_label
        hidden = ready.hidden_size
        chunk_tokens = int(extract.get("chunk_tokens", 256))
        # Locked before the scratch store is looked at; held until the store is in place.
        lock = StoreLock(work_store).acquire()
    except BaseException:
        if child is not None:
            child.close()
        raise
    writer = None
    try:
        writer_kwargs = {
            "hidden_size": hidden,
            "aux_layer_ids": aux_ids,
            "provenance": provenance,
            "chunk_tokens": chunk_tokens,
            "shard_tokens": shard_tokens_for(
                extract.get("shard_tokens", "auto"), chunk_tokens, hidden, len(aux_ids)
            ),
            "precision": str(extract.get("precision", "lossless")),
            "writer_threads": extract.get("writer_threads", "auto"),
            "shard_encoder": extract.get("shard_encoder", SHARD_ENCODER),
        }
        writer = open_writer(work_store, lock=lock, **writer_kwargs)
        try:
            groups, bar = resume_plan(
                writer,
                work_store,
                work_errors,
                good,
                errors,
                members,
                commit_every,
                desc=f"extract {split}/{shard:03d}{cap.label}",
                progress=progress,
            )
            t0, commits, done = time.monotonic(), 0, {"tokens": 0}
            table = {"written": None}  # the errors as the table on disk holds them
            if child is not None and groups:  # it opens the store, under this job's lock
                committed, writer = writer, None
                committed.close()
                child.open(
                    work_store,
                    lock,
                    writer_kwargs,
                    committed=committed,
                    groups=groups,
                    batch_size=batch_size,
                    slabs=cap.writer_queue + 2,
                    cuda=ready.device.type == "cuda",
                )
                writer = child
                seconds["slabs"] = child.slab_seconds  # part of the setup

            in_flight = collections.deque()  # groups the writer process has, not reported

            def write_group(group, resolve: Resolve, slab=None):  # on the writer thread
                tick = time.perf_counter()
                rows = []
                for g, res in zip(group, resolve(), strict=True):
                    if isinstance(res[0], str):  # ("error", reason, detail)
                        errors[g.line] = (g.sample_id, res[1], res[2])
                        continue
                    rows.append((g.line, g.sample_id, g.input_ids, g.loss_mask, *res))
                if slab is None:
                    record(group, store_group(writer, rows))
                else:  # sent; the one before commits meanwhile, then this one at once
                    writer.send_group(rows, slab)
                    in_flight.append(group)
                    if len(in_flight) > 1:
                        record(in_flight.popleft(), writer.take_report())
                seconds["write"] += time.perf_counter() - tick

            def drain():  # on the writer thread: the reports of every group sent
                tick = time.perf_counter()
                while in_flight:
                    record(in_flight.popleft(), writer.take_report())
                seconds["write"] += time.perf_counter() - tick

            def record(group, report: dict) -> None:  # a commit's report: errors, counts
                sample_ids = {g.line: g.sample_id for g in group}
                for line in report["non_finite"]:
                    errors[line] = (sample_ids[line], "non_finite", "the target gave NaN or Inf")
                for line in report["stored"]:
                    errors.pop(line, None)
                done["tokens"] += report["tokens"]
                if errors != table["written"] or not work_errors.exists():
                    # rewritten only when it changed: a table (pandas, temp, fsync, rename)
                    # after every commit held the GIL the forward pass launches kernels with
                    write_errors(work_errors, errors, sources)
                    table["written"] = dict(errors)

            seconds["setup"] = time.perf_counter() - start
            with (
                start_writer(cap.writer_queue) as bg,
                cap.session(bool(groups), batch_size) as submit,
                forward_pinned(
                    pin_plan if groups and cap.writer_queue > 0 else None,
                    writer_threads=bg.thread_ids,
                    writer_pids=[child.pid] if writer is child else [],
                ),
            ):
                seconds["setup"] = time.perf_counter() - start  # a server may have started
                for group in groups:
                    tick = time.perf_counter()
                    if isinstance(writer, WriterProcess):  # captured into shared memory
                        slab = writer.slab_for(group, batch_size)
                        resolve = submit(group, slab.tensor)
                    else:
                        slab, resolve = None, submit(group)
                    seconds["capture"] += time.perf_counter() - tick
                    bg.submit(write_group, group, resolve, slab)  # commits in order
                    commits += 1
                    bar.update(len(group))
                    rate = done["tokens"] / max(time.monotonic() - t0, 1e-9)
                    bar.set_postfix(tok_s=f"{rate:.0f}")
                    if stop_after_commits is not None and commits >= stop_after_commits:
                        bg.submit(drain)
                        bg.wait()  # the commits asked for are on disk
                        raise Interrupted(f"stopped after {commits} commits (as asked)")
                bg.submit(drain)
            if "wait" in seconds:
                seconds["wait"] = bg.waited_s
            if writer is child:
                seconds["writer_process_busy"] = child.busy_s
            bar.close()
            writer.finish()
            outcome = Outcome(out_store, errors_csv, writer.num_samples, writer.num_tokens)
        finally:
            if writer is not None:
                writer.close()
        place_store(work_store, work_errors, out_store, errors_csv, errors, sources)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        raise ExtractError(
            for_extract(work_store, out_store, writer, good, aux_ids, hidden)
        ) from exc
    finally:
        if child is not None and writer is not child:  # never opened (nothing left to do)
            child.close()
        lock.release()
    with contextlib.suppress(OSError):
        work_store.parent.rmdir()  # only when empty
    outcome.errors = count_reasons(errors)
    count_cuts(outcome, good, errors, max_tokens)
    seconds["total"] = time.perf_counter() - start
    outcome.seconds = seconds
    cap.finish(outcome)
    log.info(
        "%s: %d samples, %d tokens, %d errors %s",
        out_store,
        outcome.samples,
        outcome.tokens,
        len(errors),
        outcome.errors,
    )
    return outcome
