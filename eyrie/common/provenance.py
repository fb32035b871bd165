"""What an output was made with: file digests, package versions, the machine.

Every store, drafter and report records these, so a result can be traced to its inputs and a
rerun on other software is visible.
"""

from __future__ import annotations

import hashlib
import os
import platform
from importlib import metadata
from pathlib import Path

# The packages whose versions an output records (besides python and eyrie itself).
PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "zarr", "numcodecs", "numpy")


def file_sha256(path: str | Path) -> str:
    """sha256 of a file, read in 16 MiB blocks (weights files run to many GB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def dir_bytes(path: str | Path) -> int:
    """Bytes of all files below a folder (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def package_versions(packages=PACKAGES) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in (*packages, "eyrie"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def machine() -> dict:
    """What a timing ran on: CPU model and cores, torch threads, the GPU if any, versions."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover - a dependency
        pass
    return info
