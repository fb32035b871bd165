"""The client's side of the dump protocol (eyrie/sglang/patch/protocol.py).

The patch in the server writes a request's states to the dump folder, one file per prefill chunk;
the client joins the chunks by their prefix length, checks them (the chunks cover the prompt
exactly, the server saw our token ids at positions 0..T-1), deletes them and hands the states
on. A missing or wrong dump raises SglangError saying what the server did instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from eyrie.common.errors import ExtractError
from eyrie.sglang.patch import protocol as proto


class SglangError(ExtractError):
    """The server or its patch did not deliver what the protocol promises; says what to fix."""


@dataclass
class Stats:
    requests: int = 0
    tokens: int = 0
    chunks: int = 0
    chunked: int = 0  # requests that arrived in more than one pass
    max_chunks: int = 0
    waited_s: float = 0.0  # time spent waiting for room in the dump folder
    # summed over requests (threads overlap): where the client's time goes
    dump_wait_s: float = 0.0  # from asking for a request's dumps until all its chunks are there
    read_s: float = 0.0  # reading, checking and deleting them

    def add(self, tokens: int, chunks: int) -> None:
        self.requests += 1
        self.tokens += tokens
        self.chunks += chunks
        self.chunked += chunks > 1
        self.max_chunks = max(self.max_chunks, chunks)


class Arrivals:
    """Wakes the request threads whose files arrived in the dump folder, from one thread that
    lists the folder every `tick_s` while any request waits.

    With tens of requests in flight in one process, each polling the folder on its own, the
    threads spent their time taking turns at the interpreter's lock (py-spy on
    benchmarks/bench_dump_client.py); here a waiting thread blocks on an event until one of the
    names it waits for is listed, or until its timeout.
    """

    def __init__(self, path: Path, tick_s: float = 0.001):
        self.path, self.tick_s = path, tick_s
        self._cv = threading.Condition()
        self._waiting: dict[str, list[threading.Event]] = {}
        self._running = False

    def wait(self, names: list[str], timeout: float) -> None:
        """Until one of `names` is in the folder (it may already be), or `timeout` passes."""
        event = threading.Event()
        with self._cv:
            for name in names:
                self._waiting.setdefault(name, []).append(event)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="eyrie-dump-arrivals", daemon=True).start()
        event.wait(timeout)
        with self._cv:
            for name in names:
                events = self._waiting.get(name)
                if events and event in events:
                    events.remove(event)
                    if not events:
                        del self._waiting[name]

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    if not self._waiting:
                        self._running = False
                        return
                    names = set(self._waiting)
                try:
                    here = names.intersection(os.listdir(self.path))
                except OSError:
                    here = names  # the folder is gone: let the waiters see why
                if here:
                    with self._cv:
                        for name in here:
                            for event in self._waiting.get(name, []):
                                event.set()
                time.sleep(self.tick_s)
        except BaseException:  # the next waiter starts a lister again
            with self._cv:
                self._running = False
            raise


@dataclass
class DumpFolder:
    """The client's side of the dump protocol (eyrie/sglang/patch/dump.py)."""

    path: Path
    manifest_sha256: str
    bundle: Path
    external: bool = False
    server_log: Path | None = None
    server: object = None  # the launched SglangServer, for its log when it dies
    stats: Stats = field(default_factory=Stats)
    closed: bool = False  # set when the job stops: waiting threads give up at once
    _scan_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _arrivals: Arrivals | None = field(default=None, repr=False)
    _scanned: int = 0
    _scanned_at: float = float("-inf")

    def nbytes(self) -> int:
        total = 0
        with os.scandir(self.path) as it:
            for entry in it:
                with contextlib.suppress(OSError):
                    total += entry.stat().st_size
        return total

    def nbytes_recent(self, max_age_s: float = 0.05) -> int:
        """nbytes(), scanned at most every `max_age_s` whatever the number of request threads
        asking (a scan stats every file of the folder)."""
        with self._scan_lock:
            now = time.monotonic()
            if now - self._scanned_at > max_age_s:
                self._scanned, self._scanned_at = self.nbytes(), now
            return self._scanned

    def statuses(self) -> list[dict]:
        out = []
        for p in sorted(self.path.glob(f"{proto.STATUS_PREFIX}*.json")):
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(p.read_text()))
        return out

    def sweep(self, older_than_s: float) -> int:
        """Remove files older than `older_than_s` that no live request can still own (a shared,
        fixed folder keeps what a killed server or job left: chunks of rids never sent again,
        half-written temporaries); status files stay. How many were removed."""
        cutoff, removed = time.time() - older_than_s, 0
        with os.scandir(self.path) as it:
            for entry in it:
                if entry.name.startswith(proto.STATUS_PREFIX) or not entry.is_file():
                    continue
                with contextlib.suppress(OSError):
                    if entry.stat().st_mtime < cutoff:
                        os.unlink(entry.path)
                        removed += 1
        return removed

    def clear(self, rid: str) -> None:
        """Remove a rid's files left by an earlier attempt (an external server's folder)."""
        key = proto.rid_key(rid)
        for p in self.path.glob(f"{key}.*"):
            p.unlink(missing_ok=True)

    def where(self) -> str:
        if self.external:
            return (
                f"start the server with {self.bundle}/launch.sh and "
                f"EYRIE_PATCH_DUMP_DIR={self.path}"
            )
        return f"see the server log {self.server_log}"

    def check_loaded(self, mechanism: str, rid_prefix: str, wait_s: float = 10.0) -> list[dict]:
        """The status files of this bundle's patch; SglangError when it is not loaded."""
        deadline = time.monotonic() + wait_s
        while True:
            statuses = self.statuses()
            errors = [s["install_error"] for s in statuses if s.get("install_error")]
            if errors:
                raise SglangError(f"{errors[0]} ({self.where()})")
            bad = [s for s in statuses if s.get("files_ok") is False]
            if bad:
                raise SglangError(
                    f"the server's SGLang differs from the verified one: {bad[0]['mismatch']}; "
                    "rerun verify_env and patch_server where the server runs"
                )
            ours = [s for s in statuses if s.get("manifest_sha256") == self.manifest_sha256]
            if ours:
                keeps = [s for s in ours if rid_prefix.startswith(s.get("rid_prefix") or "\0")]
                if not keeps:
                    raise SglangError(
                        f"the server keeps requests whose rid starts with "
                        f"{ours[0].get('rid_prefix')!r}; this job sends {rid_prefix!r}: set "
                        "capture.sglang.rid_prefix to the server's"
                    )
                return ours
            if time.monotonic() > deadline:
                other = " (it holds status files of another bundle)" if statuses else ""
                raise SglangError(
                    f"the server answers but Eyrie's capture patch ({mechanism}) is not loaded "
                    f"in it: no status file of {self.bundle}/manifest.json in {self.path}{other}; "
                    f"{self.where()}"
                )
            time.sleep(0.2)

    def _error(self, rid: str) -> dict | None:
        p = self.path / proto.error_name(rid)
        if not p.is_file():
            return None
        with contextlib.suppress(OSError, ValueError):
            return json.loads(p.read_text())
        return {"reason": "unreadable", "detail": str(p)}

    def collect(self, rid: str, input_ids: np.ndarray, timeout: float):
        """The request's (aux (T, k, H), final (T, H)), its chunks checked, joined and deleted.

        The chunks are looked up by name, prefix after prefix (a stat each, not a listing of
        the folder), and each is read whole as soon as it is there: with tens of requests in
        flight in one process, what a request costs the client between its answer and its
        states bounds the whole extraction (benchmarks/bench_dump_client.py).
        """
        total = len(input_ids)
        t0 = time.perf_counter()
        # The server writes a pass's files from a thread of its own, so they may land a few
        # milliseconds after the answer: wait for them to be listed.
        if self._arrivals is None:
            self._arrivals = Arrivals(self.path)
        deadline, fallback = time.monotonic() + timeout, 0.0025
        read: dict[int, dict] = {}  # prefix -> the chunk's tensors
        paths, lengths, at = [], {}, 0
        waited = 0.0
        while True:
            err = self._error(rid)
            if err is not None:
                raise SglangError(
                    f"the server could not capture sample {rid!r}: {err.get('reason')}: "
                    f"{err.get('detail')}"
                )
            while at < total:
                path = self.path / proto.chunk_name(rid, at)
                try:
                    meta, tensors = read_chunk(path)
                except FileNotFoundError:
                    break
                if meta.get("rid") != rid or int(meta.get("prefix", -1)) != at:
                    raise SglangError(
                        f"{path} holds rid {meta.get('rid')!r} prefix {meta.get('prefix')}, "
                        f"not {rid!r} at {at}"
                    )
                read[at], lengths[at] = tensors, int(meta["tokens"])
                paths.append(path)
                at += lengths[at]
            if at >= total:
                break
            if time.monotonic() > deadline:
                raise SglangError(self._missing(rid, total, lengths))
            if self.closed:
                raise SglangError("the job is stopping")
            t_wait = time.perf_counter()
            names = [proto.chunk_name(rid, at), proto.error_name(rid)]
            # the lister wakes it; the timeout bounds a wake-up the lister misses (short first:
            # a dump lands milliseconds after its answer; longer while the server is behind)
            fallback = min(0.05, fallback * 2)
            self._arrivals.wait(names, min(fallback, max(0.0, deadline - time.monotonic())))
            waited += time.perf_counter() - t_wait
        t1 = time.perf_counter()
        beyond = (self.path / proto.chunk_name(rid, total)).exists()
        if at > total or beyond:
            more = f", and one at {total}" if beyond else ""
            raise SglangError(
                f"the dumps of sample {rid!r} do not tile its {total} tokens (chunks at "
                f"{sorted(lengths.items())}{more}); the server computed another prompt"
            )
        for path in paths:
            path.unlink(missing_ok=True)
        order = sorted(read)
        aux_t = _joined([read[p]["aux"] for p in order])
        final_t = _joined([read[p]["final"] for p in order])
        ids = [read[p].get("input_ids") for p in order]
        pos = [read[p].get("positions") for p in order]
        if all(i is not None for i in ids):
            seen = _joined(ids).numpy()
            if not np.array_equal(seen, np.asarray(input_ids, dtype=np.int64)):
                bad = int(np.argmax(seen != np.asarray(input_ids, dtype=np.int64)))
                raise SglangError(
                    f"the server computed other token ids for sample {rid!r} (first difference "
                    f"at token {bad}): the dumps belong to another prompt"
                )
        if all(p is not None for p in pos):
            if not torch.equal(_joined(pos), torch.arange(total, dtype=torch.int64)):
                raise SglangError(
                    f"the dumps of sample {rid!r} sit at positions other than 0..{total - 1}"
                )
        self.stats.add(total, len(order))
        self.stats.dump_wait_s += waited
        self.stats.read_s += (t1 - t0 - waited) + (time.perf_counter() - t1)
        return aux_t, final_t

    def _missing(self, rid: str, total: int, lengths: dict) -> str:
        if lengths:
            return (
                f"the dumps of sample {rid!r} cover only {sorted(lengths.items())} of its "
                f"{total} tokens after the server answered; {self.where()}"
            )
        statuses = [s for s in self.statuses() if s.get("manifest_sha256") == self.manifest_sha256]
        if not statuses:
            return (
                f"the server answered sample {rid!r} but wrote no dump and Eyrie's patch is not "
                f"loaded in it (no status file in {self.path}); {self.where()}"
            )
        problems = sorted({p for s in statuses for p in s.get("problems", [])})
        hint = f" Problems it reported: {'; '.join(problems)}." if problems else ""
        return (
            f"the server answered sample {rid!r} but its hooks captured nothing for it (patch "
            f"loaded in pids {[s.get('pid') for s in statuses]}).{hint} The hooked modules did "
            "not run: a hook spec matched no module ('No modules matched' in the server log), "
            f"or the pass ran in a CUDA graph or compiled region; {self.where()}"
        )


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The chunks' tensors one after another (no copy for a request that came in one pass)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def read_chunk(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(metadata, tensors) of a chunk file; FileNotFoundError when it is not there yet. The
    tensors map the file (safetensors' reader): no copy here, and none of the dump folder's
    RAM (tmpfs) while the store's writer reads them; deleting the file keeps the mapping."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {}), {name: f.get_tensor(name) for name in f.keys()}
