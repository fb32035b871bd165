"""The one HTTP client of Eyrie's SGLang servers: standard library only, JSON in and out.

Only the standard library is used, so the online measurement runs on a GPU image that has
SGLang and torch but not Eyrie's other dependencies. Requests go straight to the server
(http.client, no proxy from the environment: these servers are Eyrie's own or the user's,
usually on 127.0.0.1). A caller that must be able to give up on requests in flight (a server
that hangs holds them until their timeout) passes an `Inflight`, whose `cancel()` shuts their
sockets down at once.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse

from eyrie.common.errors import EyrieError

CONNECT_TIMEOUT_S = 30.0  # a connect the kernel does not answer is no request; the read may wait


class HttpError(EyrieError, RuntimeError):
    """The server could not be reached, or its answer could not be read."""

    def __init__(self, message: str, cause: BaseException | None = None, why: str = ""):
        super().__init__(message)
        self.cause = cause
        self.why = why or message  # the failure alone: "connection refused", "timed out", ...

    @property
    def refused(self) -> bool:
        """Nothing listens at the address (the server is down)."""
        return isinstance(self.cause, ConnectionRefusedError)

    @property
    def timed_out(self) -> bool:
        return isinstance(self.cause, (TimeoutError, socket.timeout))


class Inflight:
    """The connections of requests in flight, which `cancel()` cuts (and any opened after)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._conns: set[http.client.HTTPConnection] = set()
        self.cancelled = False

    def add(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if self.cancelled:
                raise HttpError("the request was cancelled: the job is stopping")
            self._conns.add(conn)

    def discard(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._conns.discard(conn)

    def cancel(self) -> None:
        """Shut down every connection in flight: their reads return at once."""
        with self._lock:
            self.cancelled = True
            conns = list(self._conns)
        for conn in conns:
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def _why(exc: BaseException) -> str:
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, (ConnectionResetError, http.client.RemoteDisconnected, BrokenPipeError)):
        return "connection closed by the server"
    return str(exc) or type(exc).__name__


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpError(f"{url} is not an http(s) URL")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=min(timeout, CONNECT_TIMEOUT_S))
    path = parts.path or "/"
    return conn, f"{path}?{parts.query}" if parts.query else path


def request(
    method: str,
    url: str,
    body: bytes | None,
    timeout: float,
    *,
    inflight: Inflight | None = None,
) -> tuple[int, str]:
    """(status, body text) of one request; a connection failure raises HttpError."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    try:
        conn, path = _connection(url, timeout)
    except ValueError as exc:  # a bad port
        raise HttpError(f"{method} {url} failed: {exc}") from None
    try:
        if inflight is not None:
            inflight.add(conn)
        conn.connect()
        conn.sock.settimeout(timeout)
        if inflight is not None and inflight.cancelled:
            raise HttpError("the request was cancelled: the job is stopping")
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as exc:
        raise HttpError(f"{method} {url} failed: {_why(exc)}", exc, _why(exc)) from None
    finally:
        if inflight is not None:
            inflight.discard(conn)
        conn.close()


def post(url: str, payload: dict, timeout: float, *, inflight: Inflight | None = None):
    """(status, body text) of a JSON POST; an HTTP error status is returned, not raised.

    A connection failure (refused, reset, timed out) raises HttpError naming the url."""
    return request("POST", url, json.dumps(payload).encode(), timeout, inflight=inflight)


def post_json(
    url: str, payload: dict, timeout: float, *, inflight: Inflight | None = None
) -> tuple[int, dict]:
    """(status, parsed body) of a JSON POST; an error body that is not JSON is {"error": text}."""
    status, text = post(url, payload, timeout, inflight=inflight)
    if ok(status):
        try:
            return status, json.loads(text or "{}")
        except ValueError as exc:
            raise HttpError(f"POST {url} failed: {exc}") from None
    try:
        return status, json.loads(text)
    except ValueError:
        return status, {"error": text[:500]}


def ok(status: int) -> bool:
    """A 2xx status."""
    return 200 <= status < 300


def get_status(url: str, timeout: float = 5.0) -> tuple[int | None, str]:
    """(status, "") of GET `url`, or (None, why) when no answer came (refused, timed out)."""
    try:
        status, _ = request("GET", url, None, timeout)
    except HttpError as exc:
        return None, exc.why
    return status, ""


def http_ok(url: str, timeout: float = 5.0) -> bool:
    """Whether GET `url` answers 200 (a health check)."""
    return get_status(url, timeout)[0] == 200
