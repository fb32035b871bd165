"""The one HTTP client of Eyrie's SGLang servers: standard library only, JSON in and out.

Only the standard library is used, so the online measurement runs on a GPU image that has
SGLang and torch but not Eyrie's other dependencies.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from eyrie.common.errors import EyrieError


class HttpError(EyrieError, RuntimeError):
    """The server could not be reached, or its answer could not be read."""


def post(url: str, payload: dict, timeout: float) -> tuple[int, str]:
    """(status, body text) of a JSON POST; an HTTP error status is returned, not raised.

    A connection failure (refused, reset, timed out) raises HttpError naming the url."""
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise HttpError(f"POST {url} failed: {exc}") from None


def post_json(url: str, payload: dict, timeout: float) -> tuple[int, dict]:
    """(status, parsed body) of a JSON POST; an error body that is not JSON is {"error": text}."""
    status, text = post(url, payload, timeout)
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
    """A status urllib answers without raising HTTPError."""
    return 200 <= status < 300


def http_ok(url: str, timeout: float = 5.0) -> bool:
    """Whether GET `url` answers 200 (a health check)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
