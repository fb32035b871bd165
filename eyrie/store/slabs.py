"""Host memory shared by two processes: captured states handed from the forward to the writer.

Why: a writer thread in the forward's process competes with it for the interpreter, and the
forward of a GPU target launches its kernels from Python, so every thread added to the writer
slowed the forward (benchmarks/RESULTS.md, "Where the rest goes"). A writer process has its own
interpreter; the states reach it through memory both map, never through a pipe or a pickle.

A slab is an anonymous memory file (``memfd_create``: no file system, no /dev/shm size limit,
gone when the last process closing it ends) mapped by the forward's process and, through its
file descriptor, by the writer's. On CUDA the slab is registered with the driver
(``cudaHostRegister``), so device-to-host copies into it run asynchronously, as into pinned
memory. One slab holds one commit group; a bump allocator hands out its aligned pieces.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
from pathlib import Path

import numpy as np

log = logging.getLogger("eyrie.store.slabs")
_ids = itertools.count()
ALIGN = 4096  # every piece starts on a page: copies into it and views of it stay aligned


def aligned(nbytes: int) -> int:
    return -(-int(nbytes) // ALIGN) * ALIGN


def supported() -> bool:
    """Whether this OS can share slabs (Linux's memfd_create)."""
    return hasattr(os, "memfd_create")


def available_memory(
    meminfo="/proc/meminfo", self_cgroup="/proc/self/cgroup", cgroup_root="/sys/fs/cgroup"
) -> int | None:
    """Bytes this process may still take: the kernel's MemAvailable, or less where a cgroup v2
    memory limit (a SLURM job's --mem, a container's) leaves less; None where neither is known.

    Slabs registered with CUDA are locked in memory: past this, the job is killed, not slowed.
    """
    found = []
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        for line in Path(self_cgroup).read_text().splitlines():
            if line.startswith("0::"):
                group = Path(cgroup_root) / line[3:].strip().lstrip("/")
                limit = (group / "memory.max").read_text().strip()
                if limit != "max":
                    current = int((group / "memory.current").read_text().strip())
                    found.append(max(0, int(limit) - current))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


class SlabFull(RuntimeError):
    """More was allocated from a slab than it was sized for (a sizing bug, never user input)."""


class Slab:
    """One shared memory file, mapped here; `fd` is what the other process maps."""

    def __init__(self, nbytes: int, *, fd: int | None = None):
        self.nbytes = aligned(max(int(nbytes), 1))
        if fd is None:
            fd = os.memfd_create("eyrie-states", os.MFD_CLOEXEC)
            os.ftruncate(fd, self.nbytes)
        self.fd = fd
        self._map = mmap.mmap(fd, self.nbytes)
        self.bytes = np.frombuffer(self._map, dtype=np.uint8)
        self.used = 0
        self.id = next(_ids)  # how the two processes name it
        self.announced = False  # whether the other process has its descriptor yet
        self._registered: int | None = None  # the base address cudaHostRegister was given
        self._cudart = None  # torch's CUDA runtime module, kept for unregistering

    # -- the forward's side -------------------------------------------------------------------

    def register_cuda(self) -> bool:
        """Pin the slab for asynchronous copies from the GPU; False (and a warning) if refused."""
        import torch

        base = self.bytes.ctypes.data
        self._cudart = torch.cuda.cudart()
        err = self._cudart.cudaHostRegister(base, self.nbytes, 0)
        if int(getattr(err, "value", err)) != 0:
            log.warning(
                "cudaHostRegister refused %d bytes (%s): copies into the writer's shared "
                "memory will wait for the GPU",
                self.nbytes,
                err,
            )
            return False
        self._registered = base
        return True

    @property
    def registered(self) -> bool:
        return self._registered is not None

    def reset(self) -> None:
        """Start allocating from the beginning again (the writer has let go of every piece)."""
        self.used = 0

    def take(self, nbytes: int) -> int:
        """The offset of a new aligned piece of `nbytes` bytes."""
        at, self.used = self.used, self.used + aligned(nbytes)
        if self.used > self.nbytes:
            raise SlabFull(f"a slab of {self.nbytes} bytes was asked for {self.used}")
        return at

    def tensor(self, shape, dtype):
        """A new torch tensor living in the slab (the capture's host buffer)."""
        import torch

        n = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        at = self.take(n)
        return torch.from_numpy(self.bytes[at : at + n]).view(dtype).view(*shape)

    def put(self, values: np.ndarray) -> list:
        """Copy an array into the slab; returns its place as [offset, dtype, shape]."""
        values = np.ascontiguousarray(values)
        at = self.take(values.nbytes)
        self.bytes[at : at + values.nbytes] = values.reshape(-1).view(np.uint8)
        return [at, values.dtype.str, list(values.shape)]

    def place_of(self, t) -> list:
        """[offset, dtype, shape] of a contiguous torch tensor living in the slab, as uint16."""
        if not t.is_contiguous():
            raise SlabFull("a captured row is not contiguous in the slab")
        at = t.data_ptr() - self.bytes.ctypes.data
        if not 0 <= at <= self.nbytes - t.numel() * t.element_size():
            raise SlabFull("a captured row does not live in this slab")
        return [at, np.dtype(np.uint16).str, list(t.shape)]

    # -- the writer's side --------------------------------------------------------------------

    def view(self, place: list) -> np.ndarray:
        """The array at a place given by `put` or `place_of` (a view: nothing is copied)."""
        at, dtype, shape = place
        dtype = np.dtype(dtype)
        n = int(np.prod(shape)) * dtype.itemsize
        if not 0 <= at <= self.nbytes - n:
            raise SlabFull(f"a piece at {at} of {n} bytes is outside a slab of {self.nbytes}")
        return self.bytes[at : at + n].view(dtype).reshape(shape)

    def __del__(self):
        # a registered range left behind would make CUDA refuse the next map at its address
        if getattr(self, "_registered", None) is not None:
            try:
                self.close()
            except Exception:  # at interpreter exit the driver may be gone already
                pass

    def close(self) -> None:
        """Unregister, drop this process's map and descriptor (views must be gone by then)."""
        if self._registered is not None:
            self._cudart.cudaHostUnregister(self._registered)
            self._registered = None
        self.bytes = None
        try:
            self._map.close()
        except BufferError:  # a view is still alive: the map goes with it
            pass
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class SlabPool:
    """Slabs a finished writer process let go of, kept for the next one in this process.

    Registering memory with CUDA costs about as much as torch's pinned allocations, which torch
    caches too: a process that runs several jobs (a benchmark's repeats) and shares one pool
    pays it once. `keep` is how many are kept; 0 closes each as it is given back.
    """

    def __init__(self, keep: int = 0):
        self.keep = int(keep)
        self._kept: list[Slab] = []

    def take(self, need: int, cuda: bool) -> Slab | None:
        """The smallest kept slab holding `need` bytes (registered with CUDA when asked)."""
        fits = [s for s in self._kept if s.nbytes >= need and s.registered == cuda]
        if not fits:
            return None
        slab = min(fits, key=lambda s: s.nbytes)
        self._kept.remove(slab)
        return slab

    def give(self, slab: Slab) -> None:
        """Keep a slab no other process maps any more; past `keep`, the oldest is closed."""
        slab.announced = False
        self._kept.append(slab)
        while len(self._kept) > self.keep:
            self._kept.pop(0).close()
