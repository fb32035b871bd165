"""Wheels made in a test: a zip with a .dist-info, enough for pip and for eyrie.fetch."""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes | Path]) -> Path:
    """Write NAME-VERSION-py3-none-any.whl into `folder` holding `files` (path in the wheel ->
    bytes, or a file to copy in)."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{name.replace('-', '_')}-{version}"
    wheel = folder / f"{stem}-py3-none-any.whl"
    info = f"{stem}.dist-info"
    meta = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: "
        b"py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            if isinstance(data, Path):
                zf.write(data, path)
            else:
                zf.writestr(path, data)
        for path, data in meta.items():
            zf.writestr(path, data)
        zf.writestr(f"{info}/RECORD", "")
    return wheel


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class CopyDownloader:
    """A downloader that copies a wheel made in the test and counts its calls."""

    def __init__(self, wheel: Path):
        self.wheel = wheel
        self.calls: list[str] = []

    def __call__(self, requirement: str, dest: Path) -> None:
        self.calls.append(requirement)
        shutil.copy(self.wheel, dest / self.wheel.name)
