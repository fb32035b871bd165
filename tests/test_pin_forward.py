"""extract.pin_forward (eyrie/extract/cpus.py): the forward thread on a CPU of its own.

Checked against the kernel's own record of each thread's CPUs (sched_getaffinity by thread
id), not against what the module says it did.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from test_extract import EXTRACT, run
from test_write_process import file_hashes, setup  # noqa: F401 (the module's fixture)

from eyrie.common.errors import ExtractError
from eyrie.extract import cpus
from eyrie.extract.cpus import forward_cpu_plan, forward_pinned, threads_of
from eyrie.store.background import BackgroundWriter

linux = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux")
two_cpus = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs 2 CPUs this process may use",
)


@linux
def test_auto_pins_only_a_cuda_target_with_a_writer_process_and_four_cpus(monkeypatch):
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {2, 3, 5, 7})
    assert forward_cpu_plan("auto", writer_process=True, device_type="cuda") == (2, {3, 5, 7})
    assert forward_cpu_plan("auto", writer_process=False, device_type="cuda") is None
    assert forward_cpu_plan("auto", writer_process=True, device_type="cpu") is None
    assert forward_cpu_plan(False, writer_process=True, device_type="cuda") is None
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {4, 9, 11})
    assert forward_cpu_plan("auto", writer_process=True, device_type="cuda") is None
    # true pins on anything with two CPUs, a CPU target and a writer thread included
    assert forward_cpu_plan(True, writer_process=False, device_type="cpu") == (4, {9, 11})


@linux
def test_bad_settings_name_the_key_and_the_fix(monkeypatch):
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {0})
    with pytest.raises(ExtractError, match="pin_forward: true needs 2 CPUs.*auto or false"):
        forward_cpu_plan(True, writer_process=True, device_type="cuda")
    assert forward_cpu_plan("auto", writer_process=True, device_type="cuda") is None
    with pytest.raises(ExtractError, match="pin_forward: 'yes'; use auto, true or false"):
        forward_cpu_plan("yes", writer_process=True, device_type="cuda")


@linux
@two_cpus
def test_the_forward_thread_gets_one_cpu_and_the_writers_the_others():
    allowed = os.sched_getaffinity(0)
    cpu = min(allowed)
    others = allowed - {cpu}
    bg = BackgroundWriter(1)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import threading, time; threading.Thread(target=time.sleep, "
            "args=(30,), daemon=True).start(); time.sleep(30)",
        ]
    )
    try:
        while len(threads_of(child.pid)) < 2:  # its second thread is up
            pass
        seen = {}
        with forward_pinned((cpu, others), writer_threads=bg.thread_ids, writer_pids=[child.pid]):
            seen["forward"] = os.sched_getaffinity(0)
            seen["writer thread"] = os.sched_getaffinity(bg.thread_ids[0])
            seen["child"] = {t: os.sched_getaffinity(t) for t in threads_of(child.pid)}
            started = []  # a thread the forward's thread starts shares its CPU
            t = threading.Thread(target=lambda: started.append(os.sched_getaffinity(0)))
            t.start()
            t.join()
        assert seen["forward"] == {cpu}
        assert seen["writer thread"] == others
        assert len(seen["child"]) >= 2 and set(map(frozenset, seen["child"].values())) == {
            frozenset(others)
        }
        assert started == [{cpu}]
        assert os.sched_getaffinity(0) == allowed  # all of them back once the loop ends
    finally:
        child.kill()
        child.wait()
        bg.close()


@linux
@two_cpus
def test_a_pinned_extraction_writes_the_same_bytes_and_pins_its_forward(
    setup,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    from eyrie.extract.hf import HFCapture

    real, during = HFCapture.capture_pending, []

    def recording(self, sequences, host=None):
        during.append(frozenset(os.sched_getaffinity(0)))
        return real(self, sequences, host)

    monkeypatch.setattr(HFCapture, "capture_pending", recording)
    allowed = os.sched_getaffinity(0)
    stores = {}
    for pin in (False, True):
        during.clear()
        out = tmp_path / f"pin-{pin}"
        run(setup, out, extract={**EXTRACT, "writer_process": True, "pin_forward": pin})
        stores[pin] = file_hashes(out / "shard-000.zarr")
        expected = {frozenset([min(allowed)])} if pin else {frozenset(allowed)}
        assert set(during) == expected, pin
        assert os.sched_getaffinity(0) == allowed
    assert stores[True] == stores[False]
