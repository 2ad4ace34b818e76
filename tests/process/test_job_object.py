"""The Windows job object's structures, as winnt.h lays them out (checked on every OS:
a wrong layout would make SetInformationJobObject fail or set other limits)."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from app.process.job_object import (
    BasicLimitInformation,
    ExtendedLimitInformation,
    IoCounters,
    ThreadEntry32,
    kill_on_close_limits,
    popen_held,
)


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="64-bit layout")
def test_structures_have_the_64_bit_windows_layout():
    assert ctypes.sizeof(IoCounters) == 48
    assert ctypes.sizeof(BasicLimitInformation) == 64
    assert BasicLimitInformation.LimitFlags.offset == 16
    assert BasicLimitInformation.Affinity.offset == 48
    assert ctypes.sizeof(ExtendedLimitInformation) == 144
    assert ExtendedLimitInformation.IoInfo.offset == 64
    assert ExtendedLimitInformation.ProcessMemoryLimit.offset == 112


def test_only_the_kill_on_close_limit_is_set():
    info = kill_on_close_limits()
    raw = bytes(info)
    assert int.from_bytes(raw[16:20], "little") == 0x2000
    assert raw[:16] == bytes(16) and raw[20:] == bytes(len(raw) - 20)


@pytest.mark.skipif(sys.platform != "win32", reason="a Windows job object")
def test_a_child_in_the_job_dies_when_the_handle_closes():
    from app.process.job_object import KillOnClose

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    job = KillOnClose()
    job.assign(child)
    ctypes.windll.kernel32.CloseHandle(ctypes.c_void_p(job.handle))  # type: ignore[attr-defined]
    child.wait(10)  # it ended (its exit code is Windows' to choose: none is documented)


def test_thread_entry_has_the_tlhelp32_layout():
    assert ctypes.sizeof(ThreadEntry32) == 28
    assert ThreadEntry32.th32OwnerProcessID.offset == 12


def test_a_held_child_runs_and_answers():
    """Elsewhere a plain child; on Windows one created suspended, put in this process's
    job and resumed: either way it runs its first instruction and on."""
    child = popen_held(
        [sys.executable, "-c", "import sys; print(sys.stdin.readline().upper(), end='')"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = child.communicate("held\n", timeout=60)
    assert out == "HELD\n" and child.returncode == 0


@pytest.mark.skipif(sys.platform != "win32", reason="a Windows job object")
def test_a_held_child_is_in_the_job_from_birth():
    from app.process.job_object import own_job

    child = popen_held([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        in_job = ctypes.c_int()
        kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
        kernel32.IsProcessInJob.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        job = own_job()
        assert job is not None
        assert kernel32.IsProcessInJob(int(child._handle), job.handle, ctypes.byref(in_job))
        assert in_job.value == 1
    finally:
        child.kill()
        child.wait(10)
