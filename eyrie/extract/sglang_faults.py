"""Faults of the SGLang server during an extract job: seen early, told once, in plain words.

A server can die, hang or answer errors in the middle of a job. The job then stops within
seconds (not after the 600 s request timeout) with one SglangError whose first line names the
server (its URL, and its log when the job launched it), the shard and the scratch store that
keeps the last commit, and the next step. Groups are committed whole (eyrie.extract.job), so a
stopped job leaves its last commit and a rerun resumes from there.

How a fault is seen:
- a launched server's process has exited: at once (the job's thread looks while it waits);
- nothing listens at the URL (connection refused), or a request's connection is closed by the
  server: at once (a launched server's exit is waited for a moment, to name it);
- GET /health has not answered 200 for capture.sglang.health_timeout_s while the job waits: a
  hang. SGLang's own /health runs a one-token request and answers 503 when its scheduler gives
  no output for SGLANG_HEALTH_CHECK_TIMEOUT (20 s); a stopped process answers nothing;
- an answer of /generate, read as SGLang 0.5.12 writes them (tokenizer_manager.py
  _handle_abort_finish_reason and _handle_abort_req, http_server.py generate_request):
  - 200 with meta_info.finish_reason {"type": "abort"}: aborted without a status (an
    /abort_request call, or still in the waiting queue): stop;
  - 400 {"error": {"message": ...}}: the prompt is refused, longer than the context or than the
    KV cache pool ("Input length (N tokens) exceeds the maximum allowed length (M tokens)"):
    the sample goes to the errors table (server_rejected), with the fix;
  - 500 {"message": "Out of memory even after retracting ..."}: the KV cache ran out: stop,
    naming the memory settings;
  - 503 {"message": ...} (and 429): the waiting queue is full, or a request waited or ran too
    long: stop, naming capture.sglang.concurrency;
  - any other 4xx (not an SGLang server, an API key) or 5xx (an error inside the server): stop.

A refused prompt is a property of the sample under this server (its length against the
context or the KV cache pool, both fixed for the server's life): it would be refused on every
rerun, so stopping would only block the rest of the shard. It is listed (reason
server_rejected) with the fix, and the job goes on.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from eyrie.extract.dumps import SglangError
from eyrie.sglang.http import HttpError, get_status
from eyrie.sglang.server import log_tail

log = logging.getLogger("eyrie.sglang")

RERUN = (
    "rerun the job (`snakemake --rerun-incomplete ...`, or the same `eyrie extract` command): "
    "it resumes from the last commit"
)
# What SGLang 0.5.12 logs or answers when the KV cache pool runs out (mem_cache/common.py,
# schedule_batch.py retract_decode, scheduler.py), and what torch raises when activations do.
KV_MEMORY = re.compile(
    r"Prefill out of memory|Decode out of memory|KV cache pool is full|"
    r"Out of memory even after retracting|Out of memory\. Try to lower your batch size|"
    r"alloc_req_slots runs out of memory",
    re.IGNORECASE,
)
CUDA_MEMORY = re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED")
POOL_TOO_SMALL = re.compile(r"exceeds the maximum allowed length", re.IGNORECASE)
RESUMES = "(the rerun resumes from the last commit)"


def memory_advice(kind: str, external: bool) -> str:
    """The settings that give the server's `kind` of memory ("kv", "cuda", "pool") more room.

    A launched server's flags are part of the store's settings (a change restarts the shard);
    capture.sglang.concurrency is not (a rerun with less resumes)."""
    if kind == "pool":  # a sample longer than the whole KV cache pool: only room helps
        more = (
            "restart the server with a higher --mem-fraction-static or more GPUs (--tp)"
            if external
            else "raise --mem-fraction-static (capture.sglang.server_args), add GPUs "
            "(capture.sglang.tp)"
        )
        pool = "the server's KV cache pool holds fewer tokens than this sample"
        return f"{pool}: {more}, or lower dataset.max_tokens"
    fewer = f"lower capture.sglang.concurrency {RESUMES}"
    if kind == "kv":
        more = (
            "restart the server with more KV cache (a higher --mem-fraction-static, or more "
            "GPUs: --tp), then rerun"
            if external
            else "give the server more KV cache: a higher --mem-fraction-static in "
            "capture.sglang.server_args, or more GPUs (capture.sglang.tp), which restart the shard"
        )
    else:  # activations
        more = (
            "restart the server with a lower --chunked-prefill-size or --mem-fraction-static, "
            "then rerun"
            if external
            else "leave its activations more room: a lower capture.sglang.chunked_prefill_size, "
            "or a lower --mem-fraction-static in capture.sglang.server_args, which restart the "
            "shard"
        )
    return f"{fewer}, or {more}"


@dataclass(frozen=True)
class Place:
    """Where a fault happened, for its message: the server, and the shard being extracted."""

    url: str
    log: Path | None = None  # a launched server's log; None for an external server
    shard: str | None = None  # "train/000"
    store: Path | None = None  # the scratch store holding the commits
    dump_dir: Path | None = None
    bundle: Path | None = None

    def server(self) -> str:
        return f"the SGLang server at {self.url} ({f'log {self.log}' if self.log else 'external'})"

    def job(self) -> str:
        if self.shard is None:
            return "the capture stopped"
        kept = f"; {self.store} keeps the groups committed before" if self.store else ""
        return f"extract {self.shard} stopped{kept}"

    @property
    def external(self) -> bool:
        return self.log is None

    def restart(self, when: str = "") -> str:
        """How to bring an external server back, `when` it is needed; a launched server starts
        again with the rerun."""
        if not self.external:
            return ""
        how = f"{self.bundle}/launch.sh" if self.bundle else "the bundle's launch.sh"
        dump = f" with EYRIE_PATCH_DUMP_DIR={self.dump_dir}" if self.dump_dir else ""
        return f"{when}restart it ({how}{dump}), then "

    def error(self, what: str, next_step: str, *, tail: bool = False) -> SglangError:
        message = f"{self.server()} {what}; {self.job()}. Next: {next_step}."
        if tail and self.log is not None:
            message += f"\nlast lines of {self.log}:\n{log_tail(self.log, 20)}"
        return SglangError(message)


def error_text(body) -> str:
    """The message of an error answer: SGLang's {"error": {"message"}}, ErrorResponse's
    "message", FastAPI's "detail", or the body itself."""
    text = None
    if isinstance(body, dict):
        err = body.get("error")
        text = err.get("message") if isinstance(err, dict) else err
        text = text or body.get("message") or body.get("detail")
    if text is None:
        text = json.dumps(body) if isinstance(body, (dict, list)) else str(body)
    return " ".join(str(text).split())[:300]


def read_answer(place: Place, sample_id: str, status: int, body):
    """What an answer of /generate means: None (go on), ("error", reason, detail) (list the
    sample), or an SglangError that stops the job."""
    if status == 200:
        reason = (body.get("meta_info") or {}).get("finish_reason") or {}
        if isinstance(reason, dict) and reason.get("type") == "abort":
            return place.error(
                f"aborted sample {sample_id!r} ({reason.get('message') or 'no message'}): "
                "an /abort_request call, or the server shutting down or timing requests out "
                "(SGLANG_REQ_WAITING_TIMEOUT, SGLANG_REQ_RUNNING_TIMEOUT)",
                f"{place.restart('if it is shutting down, ')}{RERUN}",
            )
        return None
    text = error_text(body)
    if status == 400:
        pool = POOL_TOO_SMALL.search(text)
        hint = f" ({memory_advice('pool', place.external)})" if pool else ""
        return ("error", "server_rejected", f"HTTP {status}: {text}{hint}")
    what = f"answered HTTP {status} to sample {sample_id!r}: {text}"
    if status < 500 and status != 429:  # not a refused prompt: the wrong server, or a key
        return place.error(
            what,
            "check that capture.sglang.url is an SGLang server started with the bundle (and "
            f"its --api-key, if any); then {RERUN}",
        )
    if KV_MEMORY.search(text):
        advice = memory_advice("kv", place.external)
        return place.error(f"ran out of KV cache memory ({what})", advice, tail=True)
    if CUDA_MEMORY.search(text):
        advice = memory_advice("cuda", place.external)
        return place.error(f"ran out of GPU memory ({what})", advice, tail=True)
    if status in (429, 503):
        return place.error(
            f"is overloaded ({what})",
            "lower capture.sglang.concurrency (or raise the server's --max-queued-requests); "
            f"then {RERUN}",
        )
    where = f"its log {place.log}" if place.log else "its log"
    next_step = f"see {where} for the error; {place.restart('if it no longer serves, ')}{RERUN}"
    return place.error(what, next_step, tail=True)


class Watch:
    """Whether the server still serves: its process (launched) and GET /health (any server).

    A thread probes /health every few seconds; `check()`, called by the job's thread while it
    waits for answers, raises the fault seen, if any. `on_fault` runs once when the probe
    finds one (the capture cuts its requests in flight with it).
    """

    def __init__(self, place: Place, server, health_timeout_s: float, on_fault=None):
        self.place, self.server = place, server
        self.health_timeout = float(health_timeout_s)
        self.every = min(10.0, max(0.5, self.health_timeout / 4))
        self.on_fault = on_fault
        self.fault: SglangError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, name="eyrie-sglang-health", daemon=True)

    def start(self) -> Watch:
        """Start probing (once; a closed watch stays closed)."""
        if self._thread.ident is None and not self._stop.is_set():
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()

    def check(self, waiting: int | None) -> None:
        """Raise the fault seen so far; `waiting`: requests the job waits for."""
        if self.server is not None and not self.server.alive():
            raise self.died(waiting)
        if self.fault is not None:
            raise self.fault

    def died(self, waiting: int | None) -> SglangError:
        how = self.server.exit_description()
        tail = log_tail(self.place.log, 200) if self.place.log else ""
        plural = "s" if waiting != 1 else ""
        what = f"died ({how})" + (f" with {waiting} request{plural} waiting" if waiting else "")
        for pattern, kind, memory in ((KV_MEMORY, "kv", "KV cache"), (CUDA_MEMORY, "cuda", "GPU")):
            m = pattern.search(tail)
            if m is not None:
                line = tail[tail.rfind("\n", 0, m.start()) + 1 :].split("\n", 1)[0].strip()
                advice = memory_advice(kind, self.place.external)
                return self.place.error(
                    f"{what}, out of {memory} memory (its log: {line[:200]!r})", advice, tail=True
                )
        return self.place.error(what, f"see its log for why; {RERUN}", tail=True)

    def unreachable(self, why: str, waiting: int | None) -> SglangError:
        """The fault behind a request that could not reach the server (refused, reset)."""
        if self.server is not None:
            deadline = time.monotonic() + 3.0  # the exit may lag behind its sockets closing
            while time.monotonic() < deadline:
                if not self.server.alive():
                    return self.died(waiting)
                time.sleep(0.05)
            return self.place.error(
                f"stopped answering ({why}) though its process runs", RERUN, tail=True
            )
        return self.place.error(
            f"does not answer ({why}): it is down or restarting", f"{self.place.restart()}{RERUN}"
        )

    def timed_out(self, sample_id: str, timeout: float) -> SglangError:
        """A request that got no answer within capture.sglang.request_timeout_s."""
        if self.fault is not None:
            return self.fault
        return self.place.error(
            f"gave no answer to sample {sample_id!r} within capture.sglang.request_timeout_s "
            f"({timeout:.0f} s) though it answers GET /health",
            f"raise capture.sglang.request_timeout_s (prompts this long take longer); {RERUN}",
        )

    def _found(self, fault: SglangError) -> None:
        self.fault = fault
        if self.on_fault is not None:
            self.on_fault()

    def _probe(self) -> None:
        url = f"{self.place.url}/health"
        last_ok, why = time.monotonic(), ""
        while not self._stop.is_set():
            left = self.health_timeout - (time.monotonic() - last_ok)
            if left <= 0:
                self._found(self._hung(why))
                return
            tick = time.monotonic()
            status, no_answer = get_status(url, timeout=max(left, 0.1))
            if self._stop.is_set():
                return
            if status == 200:
                last_ok, why = time.monotonic(), ""
            elif no_answer == "connection refused":
                self._found(self.unreachable(no_answer, None))
                return
            elif not (why and no_answer == "timed out"):
                # (a probe cut short by the window's end times out: an earlier 503 says more)
                why = no_answer or f"HTTP {status}"
                log.warning("%s: GET /health: %s", self.place.server(), why)
            now = time.monotonic()
            left = self.health_timeout - (now - last_ok)
            self._stop.wait(max(0.0, min(self.every - (now - tick), left)))

    def _hung(self, why: str) -> SglangError:
        place = self.place
        if place.log is not None:
            next_step = (
                "the job stopped the server; look in its log for a stuck scheduler, then "
                f"{RERUN}; a server that is only slow needs a higher "
                "capture.sglang.health_timeout_s"
            )
        else:
            next_step = (
                f"{place.restart()}{RERUN}; a server that is only slow needs a higher "
                "capture.sglang.health_timeout_s"
            )
        return place.error(
            f"has not answered GET /health for {self.health_timeout:g} s "
            f"(capture.sglang.health_timeout_s; last probe: {why or 'no answer'}): it hangs",
            next_step,
            tail=True,
        )


def request_failed(watch: Watch, exc: HttpError, sample_id: str, timeout: float, waiting=None):
    """The SglangError for a request that got no answer (connection failed or timed out)."""
    if exc.timed_out:
        return watch.timed_out(sample_id, timeout)
    return watch.unreachable(exc.why, waiting)
