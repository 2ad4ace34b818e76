"""The Windows job object's structures, as winnt.h lays them out (checked on every OS:
a wrong layout would make SetInformationJobObject fail or set other limits)."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from tray.job_object import (
    BasicLimitInformation,
    ExtendedLimitInformation,
    IoCounters,
    kill_on_close_limits,
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
    from tray.job_object import KillOnClose

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    job = KillOnClose()
    job.assign(child)
    ctypes.windll.kernel32.CloseHandle(ctypes.c_void_p(job.handle))  # type: ignore[attr-defined]
    assert child.wait(10) != 0
