"""An SGLang server Eyrie launched: started, watched, and always stopped.

The command line comes from eyrie.sglang.launch. `python -m sglang.launch_server` runs on
127.0.0.1 and a free port SGLang accepts (below 55535,
with port + 10000, where SGLang 0.5.12 puts its gRPC port, free too), in its own process group
(SGLang starts scheduler and detokenizer processes; stopping the group reaches them all), with
its output in a log file. Readiness is GET /health answering 200 within a timeout; a server
that exits or times out first raises ServerError carrying the log's last lines. The server is
stopped on every way out of the `with` block: normal end, exception, or SIGTERM to the job
(turned into SystemExit while the block runs). On Linux the launcher also gets SIGTERM when the
job dies without a chance to clean up (PR_SET_PDEATHSIG); SGLang's own processes follow it.
A launch that dies of a port clash (another process took the port between the check and the
bind) is retried on a new port, a few times, by `ready_server`.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from eyrie.common.errors import EyrieError
from eyrie.sglang.http import http_ok

log = logging.getLogger(__name__)


class ServerError(EyrieError, RuntimeError):
    """The server could not be started or stopped responding; the message carries its log."""


# SGLang 0.5.12 serves gRPC on port + 10000 and refuses a launch where that passes 65535
# ("ValueError: SGLANG_GRPC_PORT (69153) must be between 1 and 65535").
GRPC_OFFSET = 10000
PORT_RANGE = (20000, 65535 - GRPC_OFFSET)  # [low, high): below the ephemeral range's top
LAUNCH_ATTEMPTS = 3
# What a server log shows when the launch lost its port to another process, or SGLang refused it.
PORT_CLASH = re.compile(
    r"address already in use|errno 98\b|eaddrinuse|SGLANG_GRPC_PORT \(\d+\) must be between",
    re.IGNORECASE,
)


def _can_bind(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(rng: random.Random | None = None, tries: int = 500) -> int:
    """A port SGLang accepts: in PORT_RANGE, free on 127.0.0.1 together with port + 10000."""
    rng = rng or random.SystemRandom()  # jobs started together do not draw the same ports
    for _ in range(tries):
        port = rng.randrange(*PORT_RANGE)
        if _can_bind(port) and _can_bind(port + GRPC_OFFSET):
            return port
    raise ServerError(
        f"no port in {PORT_RANGE[0]}..{PORT_RANGE[1] - 1} is free on 127.0.0.1 together with "
        f"port + {GRPC_OFFSET} after {tries} tries; free some ports and rerun"
    )


def log_tail(path, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - not ours
        return True
    return True


class SglangServer:
    """A launched server. Use as a context manager: it is stopped however the block ends."""

    def __init__(self, cmd: list[str], log_path, port: int, *, env: dict | None = None):
        self.cmd, self.log_path, self.port = list(cmd), Path(log_path), int(port)
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.ready_s: float | None = None  # set by ready_server
        self._old_handler = None

    def start(self) -> SglangServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.cmd)}\n".encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(
                    self.cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.env,
                    start_new_session=True,  # its own process group: stop() reaches children
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                raise ServerError(f"cannot start the server ({self.cmd[0]}): {exc}") from None
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def failure(self, what: str) -> ServerError:
        return ServerError(f"{what}; last lines of {self.log_path}:\n{log_tail(self.log_path)}")

    def wait_ready(
        self, timeout: float, poll: float = 1.0, key: str = "capture.sglang.launch_timeout_s"
    ) -> float:
        """Seconds until GET /health answered 200; ServerError with the log tail otherwise."""
        t0 = time.monotonic()
        while True:
            code = self.proc.poll() if self.proc else None
            if code is not None:
                raise self.failure(f"the SGLang server exited with code {code} before it was ready")
            if http_ok(f"{self.url}/health"):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise self.failure(f"the SGLang server was not ready after {timeout:.0f} s ({key})")
            time.sleep(poll)

    def exit_description(self) -> str | None:
        """How the server ended ("exit code 1", "killed by signal SIGKILL"); None while alive."""
        code = self.proc.poll() if self.proc is not None else None
        if code is None:
            return None
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the process group, SIGKILL after `grace` seconds; then nothing is left.

        SIGCONT follows the SIGTERM: a stopped process (SIGSTOP, a suspended job) only acts on
        SIGTERM once it runs again, and would otherwise cost the whole grace period."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            if not _group_alive(pgid):
                break
            try:
                os.killpg(pgid, sig)
                if sig == signal.SIGTERM:
                    os.killpg(pgid, signal.SIGCONT)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _group_alive(pgid):
                self.proc.poll()  # reap the leader, so the group can empty
                time.sleep(0.05)
        self.proc.poll()

    def __enter__(self) -> SglangServer:
        if threading.current_thread() is threading.main_thread():
            self._old_handler = signal.signal(signal.SIGTERM, _raise_exit)
        try:
            return self.start()
        except BaseException:
            self._restore()
            raise

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            self._restore()

    def _restore(self) -> None:
        if self._old_handler is not None:
            signal.signal(signal.SIGTERM, self._old_handler)
            self._old_handler = None


def _port_clash(log_path: Path, offset: int) -> str | None:
    """The log line (written after `offset`) saying the launch lost its port, or None."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    m = PORT_CLASH.search(text)
    if m is None:
        return None
    start, end = text.rfind("\n", 0, m.start()) + 1, text.find("\n", m.end())
    return text[start : end if end >= 0 else len(text)].strip()


@contextlib.contextmanager
def ready_server(
    command,
    log_path,
    timeout: float,
    *,
    env: dict | None = None,
    key: str = "capture.sglang.launch_timeout_s",
    attempts: int = LAUNCH_ATTEMPTS,
    server_cls: type[SglangServer] = SglangServer,
):
    """A started server of `command(port)`, ready (its `ready_s` set), stopped on leaving.

    A launch that fails with a port clash in its log (address in use, or SGLang refusing the
    port) is stopped and retried on a new port, up to `attempts` launches in all.
    """
    log_path, tried = Path(log_path), []
    for _ in range(attempts):
        port = free_port()
        tried.append(port)
        offset = log_path.stat().st_size if log_path.exists() else 0
        with server_cls(command(port), log_path, port, env=env) as server:
            try:
                server.ready_s = server.wait_ready(timeout, key=key)
            except ServerError:
                clash = _port_clash(log_path, offset)
                if clash is None:
                    raise
                log.warning("SGLang could not use port %d (%s); retrying on another", port, clash)
                continue
            yield server
            return
    raise server.failure(
        f"the SGLang server failed with a port clash on each of {len(tried)} launches "
        f"(ports {', '.join(map(str, tried))} on 127.0.0.1; {clash}): another process is "
        "taking ports in this range; stop it or rerun"
    )


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)
