"""The one rule for picking a torch device from a config's `device: auto | cpu | cuda`."""

from __future__ import annotations

from eyrie.common.errors import EyrieError


class DeviceError(EyrieError, ValueError):
    """A configured device this machine does not have, or a name that is not a device."""


def pick_device(name: str = "auto", key: str = "device", local_rank: int | None = None):
    """auto takes CUDA when torch sees it; `key` names the config key in the error.

    With `local_rank` (a DDP rank), CUDA is that rank's GPU and becomes the current device.
    """
    import torch

    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise DeviceError(f"{key} is 'cuda' but torch sees no CUDA device; use auto or cpu")
        if local_rank is None:
            return torch.device("cuda")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if name not in ("auto", "cpu"):
        raise DeviceError(f"{key} {name!r} is not one of auto, cpu, cuda")
    return torch.device("cpu")
