"""Extract one shard of one split: tokenize, capture, and append to a shard store.

`extract_shard` runs an ExtractJob, whose three steps are the pipeline:

- plan: read the shard's samples and tokenize them, lock and resume the scratch store
  (eyrie.extract.job: a killed job's rerun goes on from its last commit), and cut what is left
  into commit groups;
- run: capture each group (eyrie.extract.job.Capture: `hf` runs the target in-process,
  eyrie.extract.hf; `sglang` sends the samples to a patched server, eyrie.extract.sglang) and
  hand it to the store's writer (eyrie.store.group_writer), which commits the groups in order
  while the next one is captured;
- place: finish the store, then move it and its errors table into place.

A sample that cannot be extracted is listed in the errors table (eyrie.data.errors_table),
never dropped; a full disk stops the job with the space it needs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from eyrie.common.disk_full import for_extract, is_disk_full
from eyrie.common.errors import ExtractError
from eyrie.data.errors_table import count_reasons, write_errors
from eyrie.data.split import read_split, shard_members
from eyrie.extract.cpus import forward_cpu_plan, forward_pinned
from eyrie.extract.job import (
    Capture,
    Outcome,
    Resolve,
    count_cuts,
    layout,
    place_store,
    provenance_for,
    resume_plan,
    work_paths,
)
from eyrie.extract.settings import (
    CaptureSettings,
    ExtractSettings,
    capture_settings,
    extract_settings,
)
from eyrie.extract.timer import Timer
from eyrie.extract.tokens import tokenize
from eyrie.extract.writing import writing_for
from eyrie.store.codecs import shard_tokens_for
from eyrie.store.group_writer import GroupWriter, Writing
from eyrie.store.lock import StoreLock
from eyrie.target.layers import resolve_aux_layer_ids

log = logging.getLogger("eyrie.extract.shard")
# extract settings that change only speed: left out of a store's provenance
WRITER_KNOBS = ("writer_threads", "writer_process", "pin_forward")
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


@dataclass(frozen=True)
class ShardTask:
    """What an extract job is asked: shard `shard` of extract.shards of a split file."""

    data_path: str | Path
    target_path: str | Path
    split: str
    shard: int
    out_store: str | Path
    errors_csv: str | Path
    capture: dict
    extract: dict
    max_tokens: int
    architecture: str | None = None
    commit_every: int = 64  # samples per commit (rounded up to whole batches)
    weights_cache: str | Path | None = None
    progress: bool = True

    # `capture` and `extract` stay as given (a store's provenance records them); the job reads
    # them typed, once, with the schema's defaults
    @cached_property
    def capture_settings(self) -> CaptureSettings:
        return capture_settings(self.capture)

    @cached_property
    def extract_settings(self) -> ExtractSettings:
        return extract_settings(self.extract)


def extract_shard(*, target=None, **task) -> Outcome:
    """Extract a shard from a split file into its store (`task`: ShardTask's fields).

    `target` may hold the already loaded eyrie.target.load.Target of `target_path` (to run
    several shards, or a benchmark, with one model); by default the target is loaded here (the
    SGLang backend only takes its tokenizer).
    """
    task = ShardTask(**task)
    return ExtractJob(task, capture_for(task, target)).execute()


def capture_for(task: ShardTask, target=None) -> Capture:
    """The capture capture.backend names."""
    backend = task.capture_settings.backend
    if backend == "sglang":
        from eyrie.extract.sglang import SglangBackend

        return SglangBackend(
            task.capture,
            split=task.split,
            shard=task.shard,
            out_store=task.out_store,
            errors_csv=task.errors_csv,
            architecture=task.architecture,
            target=target,
        )
    if backend == "hf":
        from eyrie.extract.hf import HFBackend

        return HFBackend(task.capture_settings, architecture=task.architecture, target=target)
    raise ExtractError(
        f"capture.backend {backend!r}: this extractor runs the target in-process (backend 'hf')"
    )


def stored_capture(capture: dict, aux_ids: list[int]) -> dict:
    """The capture settings a store's provenance records (SERVER_KNOBS left out)."""
    out = {**capture, "aux_layer_ids": aux_ids}
    if isinstance(out.get("sglang"), dict):
        out["sglang"] = {k: v for k, v in out["sglang"].items() if k not in SERVER_KNOBS}
    return out


class ExtractJob:
    """One extract job: plan, run, place; `execute` runs the three and returns the outcome.

    A test or a benchmark may pick the store's writer (`writing`; by default the config's
    extract.writer_process on the target's device), and may run the steps itself: a job whose
    `groups` are cut short after plan and that is closed after run, without place, leaves its
    scratch store at the last of those commits, as a killed job does.
    """

    def __init__(self, task: ShardTask, capture: Capture, writing: Writing | None = None):
        self.task, self.cap, self.writing = task, capture, writing
        self.timer = Timer(capture.seconds_keys)
        self.batch_size = batch_size = task.capture_settings.batch_size
        self.commit_every = max(batch_size, -(-int(task.commit_every) // batch_size) * batch_size)
        self.out_store, self.errors_csv = Path(task.out_store), Path(task.errors_csv)
        self.work_store, self.work_errors = work_paths(self.out_store, self.errors_csv)
        self.writer: GroupWriter | None = None
        self.lock: StoreLock | None = None
        self.groups: list = []  # the commit groups left to capture (plan)
        self.errors: dict = {}  # line -> (sample_id, reason, detail): the errors table
        self.table_written = None  # the errors as the table on disk holds them
        self.tokens_done = 0  # tokens committed by this run
        self.samples = self.tokens = 0  # in the finished store (place)

    def execute(self) -> Outcome:
        """Plan, run and place; the outcome once the store is in place and unlocked."""
        try:
            with self:
                self.plan()
                self.run()
                self.place()
        except OSError as exc:
            if self.lock is None or not is_disk_full(exc):
                raise
            raise ExtractError(self.disk_full()) from exc
        return self.outcome()

    def __enter__(self) -> ExtractJob:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the writer and let go of the store's lock (the store stays at its last commit)."""
        if self.writer is not None:
            self.writer.close()
        if self.lock is not None:
            self.lock.release()

    # -- plan -------------------------------------------------------------------------------------

    def plan(self) -> None:
        """Tokenize the shard's samples, resume the scratch store and cut the rest into groups."""
        from eyrie.target.load import num_hidden_layers

        task, cap = self.task, self.cap
        self.members = shard_members(read_split(task.data_path), task.shard, self.shards)
        configured = task.capture_settings.aux_layer_ids
        self.aux_ids = resolve_aux_layer_ids(configured, num_hidden_layers(task.target_path))
        self.ready = cap.prepare(task.target_path, self.aux_ids)
        device = self.ready.device.type
        if self.writing is None:
            self.writing = writing_for(task.extract_settings, cap.writer_queue, device, cap.backend)
        # a writer process starts now: it imports while the job tokenizes and hashes
        self.writer = GroupWriter(self.writing)
        self.pin = forward_cpu_plan(
            task.extract_settings.pin_forward,
            writer_process=self.writing.mode == "process",
            device_type=device,
        )
        self.good, self.errors = tokenize(self.ready.tokenizer, self.members, task.max_tokens)
        self.sources = {r.line: r.source for r in self.members}
        contents = self.store_contents()
        # locked before the scratch store is looked at; held until the store is in place
        self.lock = StoreLock(self.work_store).acquire()
        self.writer.open(self.work_store, self.lock, **contents)
        self.groups, self.bar = resume_plan(
            self.writer,
            self.work_store,
            self.work_errors,
            self.good,
            self.errors,
            self.members,
            self.commit_every,
            desc=f"extract {task.split}/{task.shard:03d}{cap.label}",
            progress=task.progress,
        )

    @property
    def shards(self) -> int:
        return self.task.extract_settings.shards

    def store_contents(self) -> dict:
        """ShardWriter's arguments that say what the store holds, its provenance with them."""
        task, ready, extract = self.task, self.ready, self.task.extract
        settings = {
            "capture": stored_capture(task.capture, self.aux_ids),
            # how fast the writer goes is no part of what the store holds (nor a reason to restart)
            "extract": {k: v for k, v in extract.items() if k not in WRITER_KNOBS},
            "max_tokens": int(task.max_tokens),
            "commit_every": self.commit_every,
            "architecture": ready.architecture,
            **ready.settings,
        }
        provenance = provenance_for(
            task.target_path,
            backend=self.cap.backend,
            split=task.split,
            shard=task.shard,
            shards=self.shards,
            data_path=task.data_path,
            settings=settings,
            device=ready.device,
            dtype=ready.dtype,
            weights_cache=task.weights_cache,
        )
        if ready.dtype_label is not None:
            provenance["dtype"] = ready.dtype_label
        typed = task.extract_settings
        chunk_tokens = typed.chunk_tokens
        return {
            "hidden_size": ready.hidden_size,
            "aux_layer_ids": self.aux_ids,
            "provenance": provenance,
            "chunk_tokens": chunk_tokens,
            "shard_tokens": shard_tokens_for(
                typed.shard_tokens, chunk_tokens, ready.hidden_size, len(self.aux_ids)
            ),
            "precision": typed.precision,
        }

    # -- run --------------------------------------------------------------------------------------

    def run(self) -> None:
        """Capture each group left and hand it to the writer, which commits it meanwhile."""
        groups, timer = self.groups, self.timer
        self.t0 = time.monotonic()
        layouts = [layout(g, self.batch_size) for g in groups]
        with (
            self.writer.writing(layouts, cuda=self.ready.device.type == "cuda") as writer,
            self.cap.session(bool(groups), self.batch_size) as submit,
            forward_pinned(
                self.pin if groups and self.writing.mode != "inline" else None,
                writer_threads=writer.thread_ids,
                writer_pids=writer.pids,
            ),
        ):
            if writer.slab_seconds is not None:
                timer.seconds["slabs"] = writer.slab_seconds  # part of the setup
            timer.since_start("setup")  # the writer's slabs and a server's start included
            for group, shape in zip(groups, layouts, strict=True):
                self.capture(group, shape, submit)
            writer.submit(self.flush)
        if "wait" in timer.seconds:
            timer.seconds["wait"] = writer.waited_s
        if writer.busy_s is not None:
            timer.seconds["writer_process_busy"] = writer.busy_s
        self.bar.close()

    def capture(self, group, shape, submit) -> None:
        """Capture a group (into the writer's buffer where it has one); its write is queued."""
        with self.timer.adding("capture"):
            buffer = self.writer.buffer_for(shape)
            resolve = submit(group) if buffer is None else submit(group, buffer.tensor)
        self.writer.submit(self.write, group, resolve, buffer)  # commits in order
        self.bar.update(len(group))
        rate = self.tokens_done / max(time.monotonic() - self.t0, 1e-9)
        self.bar.set_postfix(tok_s=f"{rate:.0f}")

    def write(self, group, resolve: Resolve, buffer) -> None:
        """On the writer's thread: a group's rows committed, the samples the capture refused
        listed instead."""
        with self.timer.adding("write"):
            rows = []
            for g, res in zip(group, resolve(), strict=True):
                if isinstance(res[0], str):  # ("error", reason, detail)
                    self.errors[g.line] = (g.sample_id, res[1], res[2])
                    continue
                rows.append((g.line, g.sample_id, g.input_ids, g.loss_mask, *res))
            for done, report in self.writer.write(group, rows, buffer):
                self.record(done, report)

    def flush(self) -> None:
        """On the writer's thread: the reports of every group the writer still has."""
        with self.timer.adding("write"):
            for done, report in self.writer.flush():
                self.record(done, report)

    def record(self, group, report: dict) -> None:
        """A commit's report: its non-finite samples listed, its stored ones counted."""
        sample_ids = {g.line: g.sample_id for g in group}
        for line in report["non_finite"]:
            self.errors[line] = (sample_ids[line], "non_finite", "the target gave NaN or Inf")
        for line in report["stored"]:
            self.errors.pop(line, None)
        self.tokens_done += report["tokens"]
        if self.errors != self.table_written or not self.work_errors.exists():
            # rewritten only when it changed: a table (pandas, temp, fsync, rename) after
            # every commit held the GIL the forward pass launches kernels with
            write_errors(self.work_errors, self.errors, self.sources)
            self.table_written = dict(self.errors)

    # -- place ------------------------------------------------------------------------------------

    def place(self) -> None:
        """Finish the store, then put it and its errors table in place."""
        self.writer.finish()
        self.samples, self.tokens = self.writer.num_samples, self.writer.num_tokens
        self.writer.close()  # a writer process lets go of the store before it moves
        place_store(
            self.work_store,
            self.work_errors,
            self.out_store,
            self.errors_csv,
            self.errors,
            self.sources,
        )

    def outcome(self) -> Outcome:
        """What the job did, once the store is in place and its lock released."""
        with contextlib.suppress(OSError):
            self.work_store.parent.rmdir()  # only when empty
        out = Outcome(self.out_store, self.errors_csv, self.samples, self.tokens)
        out.errors = count_reasons(self.errors)
        count_cuts(out, self.good, self.errors, self.task.max_tokens)
        self.timer.since_start("total")
        out.seconds = self.timer.seconds
        self.cap.finish(out)
        log.info(
            "%s: %d samples, %d tokens, %d errors %s",
            out.store,
            out.samples,
            out.tokens,
            len(self.errors),
            out.errors,
        )
        return out

    def disk_full(self) -> str:
        """The message for a full disk: the space stored, needed and free."""
        writer = self.writer if self.writer is not None and self.writer.opened else None
        return for_extract(
            self.work_store, self.out_store, writer, self.good, self.aux_ids, self.ready.hidden_size
        )
