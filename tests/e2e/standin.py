"""A stand-in for `python -m sglang.launch_server`, computed with transformers on the CPU.

It lets the whole SGLang path (bundle, server lifecycle, hooks, dump protocol, client, store) run
where SGLang cannot: tests and CPU-only machines. It speaks the part of SGLang's HTTP interface
the extraction uses (GET /health; POST /generate with input_ids, rid and sampling_params,
answered with output_ids and meta_info) and batches the way SGLang's scheduler does: one forward
pass at a time over the waiting requests, long prompts cut into chunks of
--chunked-prefill-size tokens, each pass described by a ForwardBatch-like object (rids,
forward_mode, extend_seq_lens_cpu, extend_prefix_lens_cpu, positions, input_ids). A warm-up
request at start and every /health call run passes under rids of their own, as SGLang's do.

`--forward-hooks` is read as SGLang reads it: each spec's factory is imported from PYTHONPATH,
called with the spec's config, and its hook attached to the modules whose names match the
spec's patterns. A hook is called with a decoder layer's inputs (positions, hidden_states,
forward_batch, residual) and output (hidden_states, residual), or with the final norm's output
(normed, residual), filled with the states a plain transformers forward gives for the whole
prompt (attention is causal, so a chunk's rows equal the whole prompt's rows at its positions).
The layer output is split between the two tensors, so a hook that does not add them fails.

Like SGLang 0.5.12 it refuses a port whose gRPC port (port + 10000) passes 65535, and a port in
use stops it ("Address already in use"). GET /health answers as SGLang's does by default
(SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION): 200 once the scheduler makes progress after the
check began, 503 when it makes none for SGLANG_HEALTH_CHECK_TIMEOUT seconds (20 by default).
With --max-total-tokens (the KV cache pool) a prompt of at least that many tokens minus 6 is
refused as SGLang's scheduler refuses it (validate_input_length): aborted with status 400,
after a one-token prefill of token 0 under the request's rid. Not simulated: decoding past the
first token, sampling, tensor parallelism, CUDA graphs.

--fault (or the environment's EYRIE_STANDIN_FAULT, so that a job's launched server can fail
without a change to the job's config) makes the server misbehave once N requests of the
workflow (rids with its prefix) have been answered:
- `radix`, `nohooks`: from the start, a radix-cache hit; hooks that never run;
- `die_after:N`: SIGKILL to itself in the next pass of the workflow's requests, after the hooks
  wrote their dumps (as SGLang's whole process tree goes when a scheduler dies);
- `stop_after:N`: SIGSTOP to itself there: connections are accepted, nothing answers;
- `hang_after:N`: the scheduler takes no more work; the HTTP front still runs (/health: 503);
- `http500_after:N`: /generate runs the request, then answers 500 "Internal Server Error" as
  an unhandled exception in SGLang's HTTP server does;
- `oom_after:N`: /generate runs the request, then answers 500 with SGLang's ErrorResponse for a
  request aborted out of KV cache memory (ScheduleBatch.retract_decode);
- `abort_after:N`: /generate answers 200 with finish_reason {"type": "abort"} and no output, as
  SGLang answers a request aborted in its waiting queue (TokenizerManager._handle_abort_req).
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import json
import os
import re
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import torch

LAYER = re.compile(r"(?:.*\.)?layers\.(\d+)$")
FAULTS = ("none", "radix", "nohooks")
AFTER_FAULTS = ("die", "stop", "hang", "http500", "oom", "abort")
# SGLang 0.5.12's messages (schedule_batch.py, utils.py) for the faults that answer
OOM_MESSAGE = (
    "Out of memory even after retracting all other requests in the decode batch. "
    "Aborting the last request."
)


def parse_fault(text: str) -> tuple[str, int]:
    """(kind, N) of a --fault value: `radix`, or `die_after:6` -> ("die", 6)."""
    if text in FAULTS:
        return text, 0
    kind, _, n = text.partition("_after:")
    if kind not in AFTER_FAULTS or not n.isdigit():
        allowed = ", ".join([*FAULTS, *(f"{k}_after:N" for k in AFTER_FAULTS)])
        raise argparse.ArgumentTypeError(f"--fault {text!r}: one of {allowed}")
    return kind, int(n)


class _Mode:
    def __init__(self, extend: bool):
        self.extend = extend

    def is_extend(self) -> bool:
        return self.extend


@dataclass
class FakeBatch:
    """The ForwardBatch fields the dump protocol reads."""

    rids: list
    extend_seq_lens_cpu: list
    extend_prefix_lens_cpu: list
    positions: torch.Tensor
    input_ids: torch.Tensor
    forward_mode: _Mode = field(default_factory=lambda: _Mode(True))


@dataclass
class _Request:
    rid: str
    ids: list
    done: int = 0  # prompt tokens already through a pass
    states: tuple | None = None  # (aux by layer, final) for the whole prompt
    event: threading.Event = field(default_factory=threading.Event)
    wait: bool = True


def resolve_factory(path: str):
    """`module:function` or `module.function`, as SGLang's hook manager accepts them."""
    module, _, name = path.partition(":") if ":" in path else path.rpartition(".")
    return getattr(importlib.import_module(module), name)


class StandIn:
    """The model, its hooks and the scheduler; `serve()` adds the HTTP front."""

    def __init__(
        self,
        model_path,
        hook_specs: list | None = None,
        *,
        chunked_prefill_size: int = 8192,
        max_running_requests: int = 8,
        context_length: int = 1 << 20,
        max_total_tokens: int | None = None,
        health_check_timeout: float = 20.0,
        fault: str = "none",
    ):
        from eyrie.target.load import load_model
        from eyrie.target.wrapped import served_tree

        self.model, _ = load_model(model_path, torch.device("cpu"))
        self.chunk = chunked_prefill_size if chunked_prefill_size > 0 else 1 << 30
        self.max_running = max_running_requests
        self.context_length = context_length
        self.max_total_tokens = max_total_tokens
        self.health_check_timeout = health_check_timeout
        self.fault, self.fault_after = parse_fault(fault)
        self.answered = 0  # requests of the workflow answered (the faults count them)
        self.fault_at: float | None = None  # time.time() when the fault first acted
        self.prefix_hint = "eyrie-"
        self.hooks: dict[str, list] = {}
        # Module names as SGLang has them: a wrapper's language model sits under its attribute.
        names = [n for n, _ in served_tree(model_path, self.model).named_modules()]
        for spec in hook_specs or []:
            hook = resolve_factory(spec["hook_factory"])(spec.get("config") or {})
            matched = [
                n for n in names if any(fnmatch.fnmatch(n, p) for p in spec["target_modules"])
            ]
            if not matched:
                print(f"No modules matched hook spec {spec.get('name')!r}", file=sys.stderr)
            for n in matched:
                self.hooks.setdefault(n, []).append(hook)
            self.prefix_hint = (spec.get("config") or {}).get("rid_prefix") or self.prefix_hint
        self.layer_ids = sorted({int(m.group(1)) for n in self.hooks if (m := LAYER.match(n))})
        self._capture = None
        if self.layer_ids:
            from eyrie.extract.hf import HFCapture

            self._capture = HFCapture(self.model, self.layer_ids, pad_token_id=0)
        self._queue: deque[_Request] = deque()
        self._cv = threading.Condition()
        self._running = True
        self._health = 0
        self.passes = 0
        self._thread = threading.Thread(target=self._loop, name="standin-scheduler", daemon=True)
        self._thread.start()
        self.submit(_Request("warmup-0", [1, 2, 3, 4]))  # the server's own warm-up prefill

    # -- requests -------------------------------------------------------------------------

    def submit(self, req: _Request) -> None:
        with self._cv:
            self._queue.append(req)
            self._cv.notify()

    def ours(self, rid: str) -> bool:
        return rid.startswith(self.prefix_hint)

    def tripped(self, kind: str) -> bool:
        """Whether fault `kind` is on now: configured, and its N requests answered."""
        on = self.fault == kind and self.answered >= self.fault_after
        if on and self.fault_at is None:
            self.fault_at = time.time()
            print(f"stand-in: fault {kind} at {self.fault_at:.3f}", flush=True)
        return on

    def max_req_input_len(self) -> int:
        """SGLang's bound on a prompt (tp_worker.py): the context and the KV pool, less 5;
        applied only where the pool is given (--max-total-tokens)."""
        if self.max_total_tokens is None:
            return 1 << 62
        return min(self.context_length - 1, self.max_total_tokens - 1) - 5

    def generate(self, rid: str, ids: list, timeout: float = 600.0) -> dict:
        req = _Request(rid, list(ids))
        self.submit(req)
        if not req.event.wait(timeout):
            raise TimeoutError(f"request {rid} did not finish in {timeout} s")
        return {
            "output_ids": [int(ids[-1])],
            "meta_info": {"id": rid, "prompt_tokens": len(ids), "cached_tokens": 0},
        }

    def health(self) -> bool:
        """Whether the scheduler made progress within the health check's timeout (SGLang's
        health_generate: a one-token request, and any output after the check began)."""
        with self._cv:
            self._health += 1
            start = self.passes
            self._queue.append(_Request(f"HEALTH_CHECK_{self._health}", [1], wait=False))
            self._cv.notify_all()
            return self._cv.wait_for(lambda: self.passes > start, self.health_check_timeout)

    def stop(self) -> None:
        with self._cv:
            self._running = False
            self._cv.notify_all()
            for req in self._queue:  # requests a hung scheduler holds: their handlers return
                req.event.set()
        self._thread.join(timeout=10)
        if self._capture is not None:
            self._capture.close()
        self.flush_dumpers()

    def flush_dumpers(self) -> None:
        """Wait for the hooks' writer threads: a status file they were refreshing is renamed into
        place before the caller lists the dump folder, as after a real server's shutdown."""
        dumpers = {
            id(d): d for hs in self.hooks.values() for h in hs if (d := getattr(h, "dumper", None))
        }
        for dumper in dumpers.values():
            try:
                dumper.flush(timeout=30)
            except OSError:  # the dump folder is gone: nothing left to list
                pass

    # -- the scheduler --------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._running and (not self._queue or self.tripped("hang")):
                    self._cv.wait()
                if not self._running:
                    return
                batch, budget = [], self.chunk
                while self._queue and budget > 0 and len(batch) < self.max_running:
                    req = self._queue.popleft()
                    take = min(len(req.ids) - req.done, budget)
                    batch.append((req, take))
                    budget -= take
            try:
                self._pass(batch)
            except Exception as exc:  # keep serving; the request gets no answer
                print(f"stand-in pass failed: {exc!r}", file=sys.stderr)
            with self._cv:
                for req, _ in reversed(batch):
                    if req.done < len(req.ids):
                        self._queue.appendleft(req)  # the chunked request goes first next time
                    else:
                        self.answered += self.ours(req.rid)
                        req.event.set()
                self._cv.notify_all()  # health checks wait for progress

    def _states(self, req: _Request):
        """The prompt's states, computed once per request (a plain forward without hooks)."""
        if req.states is None:
            ids = np.asarray(req.ids, dtype=np.int64)
            if self._capture is not None:
                ((aux, final),) = self._capture.capture([ids])
                req.states = (aux, final)
            else:
                with torch.inference_mode():
                    self.model(input_ids=torch.from_numpy(ids)[None], use_cache=False)
                req.states = ()
        return req.states

    def _pass(self, batch: list) -> None:
        rids, seq, pre, pos, ids = [], [], [], [], []
        for req, take in batch:
            if self.fault == "radix" and req.done == 0 and req.rid.startswith(self.prefix_hint):
                req.done = min(4, len(req.ids) - 1)  # as if the first tokens came from a cache
                take = min(take, len(req.ids) - req.done)
            rids.append(req.rid)
            seq.append(take)
            pre.append(req.done)
            pos.append(torch.arange(req.done, req.done + take))
            ids.append(torch.tensor(req.ids[req.done : req.done + take], dtype=torch.int64))
        fb = FakeBatch(rids, seq, pre, torch.cat(pos), torch.cat(ids))
        if self.hooks and self.fault != "nohooks":
            self._run_hooks(batch, fb)
        else:
            for req, _ in batch:
                self._states(req)
        if any(self.ours(r) for r in rids):
            for kind, sig in (("die", signal.SIGKILL), ("stop", signal.SIGSTOP)):
                if self.tripped(kind):  # after the dumps: the dead server leaves them behind
                    os.kill(os.getpid(), sig)
        for (req, _), p, n in zip(batch, pre, seq, strict=True):
            req.done = p + n
        self.passes += 1

    def _run_hooks(self, batch: list, fb: FakeBatch) -> None:
        spans = zip(batch, fb.extend_prefix_lens_cpu, fb.extend_seq_lens_cpu, strict=True)
        rows = [(self._states(req), p, n) for (req, _), p, n in spans]
        for name, hooks in self.hooks.items():
            m = LAYER.match(name)
            if m is None:
                continue
            j = self.layer_ids.index(int(m.group(1)))
            out = torch.cat([s[0][p : p + n, j] for s, p, n in rows])
            residual = torch.where(_checker(out), out, torch.zeros_like(out))
            hidden = out - residual  # hidden + residual == out, bit for bit
            for hook in hooks:
                hook(None, (fb.positions, hidden, fb, residual), (hidden, residual))
        for name, hooks in self.hooks.items():
            if LAYER.match(name) is None:
                final = torch.cat([s[1][p : p + n] for s, p, n in rows])
                for hook in hooks:
                    hook(None, (final,), (final, torch.zeros_like(final)))


def _checker(t: torch.Tensor) -> torch.Tensor:
    r = torch.arange(t.shape[0]).unsqueeze(1)
    c = torch.arange(t.shape[-1]).unsqueeze(0)
    return ((r + c) % 2 == 0).expand_as(t)


def make_handler(standin: StandIn):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):  # quiet
            pass

        def _send(self, code: int, obj) -> None:
            self._reply(code, json.dumps(obj).encode(), "application/json")

        def _send_text(self, code: int, text: str) -> None:
            self._reply(code, text.encode(), "text/plain; charset=utf-8")

        def _reply(self, code: int, body: bytes, kind: str) -> None:
            try:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up on the request (a job that stopped)

        def do_GET(self):
            if self.path in ("/health", "/health_generate"):
                if standin.health():
                    self._send(200, {})
                else:
                    self._send_text(503, "")
            elif self.path == "/get_model_info":
                self._send(200, {"model_path": "stand-in", "is_generation": True})
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self):
            if self.path != "/generate":
                self._send(404, {"error": f"no route {self.path}"})
                return
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                ids = [int(i) for i in req["input_ids"]]
                rid = str(req.get("rid") or f"anon-{time.monotonic_ns()}")
            except (ValueError, KeyError, TypeError) as exc:
                self._send(400, {"error": f"bad request: {exc}"})
                return
            if not ids or len(ids) > standin.context_length:
                self._send(
                    400,
                    {
                        "error": f"The input ({len(ids)} tokens) is longer than the model's "
                        f"context length ({standin.context_length} tokens)."
                    },
                )
                return
            ours = standin.ours(rid)
            if ours and standin.tripped("abort"):
                meta = {"id": rid, "finish_reason": {"type": "abort", "message": "Abort in "
                        "waiting queue"}, "e2e_latency": 0.0, "completion_tokens": 0}  # fmt: skip
                self._send(200, {"output_ids": [], "meta_info": meta})
                return
            limit = standin.max_req_input_len()
            if len(ids) >= limit:  # the scheduler's abort: a one-token prefill, then 400
                standin.generate(rid, [0])
                message = (
                    f"Input length ({len(ids)} tokens) exceeds the maximum allowed length "
                    f"({limit} tokens). Use a shorter input or enable --allow-auto-truncate."
                )
                self._send(400, {"error": {"message": message}})
                return
            http500, oom = standin.tripped("http500"), standin.tripped("oom")
            answer = standin.generate(rid, ids)
            if ours and http500:
                self._send_text(500, "Internal Server Error")
            elif ours and oom:
                error = {"object": "error", "message": OOM_MESSAGE, "type": "500"}
                self._send(500, {**error, "param": None, "code": 500})
            else:
                self._send(200, answer)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # the listen backlog: many clients connect at once


def serve(standin: StandIn, host: str, port: int) -> ThreadingHTTPServer:
    return _Server((host, port), make_handler(standin))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--forward-hooks", type=json.loads, default=None)
    p.add_argument("--chunked-prefill-size", type=int, default=8192)
    p.add_argument("--max-running-requests", type=int, default=8)
    p.add_argument("--context-length", type=int, default=1 << 20)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--fault", default=os.environ.get("EYRIE_STANDIN_FAULT") or "none")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args, ignored = p.parse_known_args(argv)
    if not 1 <= args.port + 10000 <= 65535:  # SGLang 0.5.12's check of its derived gRPC port
        raise ValueError(f"SGLANG_GRPC_PORT ({args.port + 10000}) must be between 1 and 65535")
    torch.set_num_threads(args.threads)
    if ignored:
        print(f"stand-in: ignoring {' '.join(ignored)}", flush=True)
    standin = StandIn(
        args.model_path,
        args.forward_hooks,
        chunked_prefill_size=args.chunked_prefill_size,
        max_running_requests=args.max_running_requests,
        context_length=args.context_length,
        max_total_tokens=args.max_total_tokens,
        health_check_timeout=float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", 20)),
        fault=args.fault,
    )
    server = serve(standin, args.host, args.port)
    print(f"stand-in serving {args.model_path} on {args.host}:{args.port}", flush=True)
    try:
        server.serve_forever()
    finally:
        standin.stop()


if __name__ == "__main__":
    main()
