"""Where Eyrie keeps what it fetched: SGLang releases for verify, packages for fetch."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$EYRIE_CACHE`` or ``~/.cache/eyrie``: where fetched releases and packages are kept."""
    env = os.environ.get("EYRIE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "eyrie"
