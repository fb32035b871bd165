"""Which of the store's writers an extract job uses (eyrie.store.group_writer.Writing).

A capture that writes on its own thread (`writer_queue` 0: SGLang writes dumps as they arrive)
writes inline; otherwise a writer thread takes `writer_queue` groups, and extract.writer_process
moves the writer into a process of its own, so that compression never competes with a GPU's
forward for the interpreter (benchmarks/RESULTS.md, "Where the rest goes").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eyrie.common.errors import ExtractError
from eyrie.store.group_writer import Writing, process_supported

if TYPE_CHECKING:
    from eyrie.extract.settings import ExtractSettings


def use_writer_process(setting, device_type: str, backend: str) -> bool:
    """extract.writer_process: auto is a process for a CUDA target on Linux, else a thread."""
    if setting in (None, "auto"):
        return backend == "hf" and device_type == "cuda" and process_supported()
    if setting is True and backend != "hf":
        raise ExtractError(
            f"extract.writer_process: true needs capture.backend hf (this is {backend!r}, which "
            "writes dumps as they arrive); set it to auto or false"
        )
    if setting is True and not process_supported():
        raise ExtractError(
            "extract.writer_process: true needs Linux (memfd_create); set it to auto or false"
        )
    return bool(setting)


def writing_for(
    extract: ExtractSettings, writer_queue: int, device_type: str, backend: str
) -> Writing:
    """The writer for a job's extract settings, its capture's queue and its target's device."""
    threads = extract.writer_threads
    if writer_queue <= 0:
        return Writing("inline", depth=0, threads=threads)
    process = use_writer_process(extract.writer_process, device_type, backend)
    return Writing("process" if process else "thread", depth=writer_queue, threads=threads)
