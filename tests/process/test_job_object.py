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


class StandInKernel32:
    """What `KillOnClose._resume` calls of kernel32, as the Win32 documentation defines
    each (a snapshot handle, THREADENTRY32 rows filled one by one, OpenThread NULL on
    failure, ResumeThread (DWORD)-1 on failure), over a list of (thread id, owner pid)
    rows: Windows' own cannot run here. It counts the handles left open."""

    def __init__(self, threads: list[tuple[int, int]], *, opens: bool = True, resumes: bool = True):
        self.threads, self.opens, self.resumes = threads, opens, resumes
        self.open_handles: set[int] = set()
        self.resumed: list[int] = []
        self._thread_of: dict[int, int] = {}  # an open handle: its thread (0: the snapshot)
        self._next_handle, self._row = 100, 0

    def _handle(self, thread: int = 0) -> int:
        self._next_handle += 1
        self.open_handles.add(self._next_handle)
        self._thread_of[self._next_handle] = thread
        return self._next_handle

    def CreateToolhelp32Snapshot(self, flags: int, pid: int) -> int:
        assert flags == 0x4 and pid == 0
        return self._handle()

    def _fill(self, entry: ctypes._CArgObject) -> int:  # type: ignore[name-defined]
        if self._row >= len(self.threads):
            return 0
        row = entry._obj  # the ThreadEntry32 behind byref
        assert row.dwSize == ctypes.sizeof(ThreadEntry32)
        row.th32ThreadID, row.th32OwnerProcessID = self.threads[self._row]
        self._row += 1
        return 1

    def Thread32First(self, snapshot: int, entry: ctypes._CArgObject) -> int:  # type: ignore[name-defined]
        self._row = 0
        return self._fill(entry)

    def Thread32Next(self, snapshot: int, entry: ctypes._CArgObject) -> int:  # type: ignore[name-defined]
        return self._fill(entry)

    def OpenThread(self, access: int, inherit: bool, thread: int) -> int | None:
        assert access == 0x2
        return self._handle(thread) if self.opens else None

    def ResumeThread(self, handle: int) -> int:
        assert handle in self.open_handles
        if not self.resumes:
            return 0xFFFFFFFF
        self.resumed.append(self._thread_of[handle])
        return 1  # the previous suspend count of a thread created suspended

    def CloseHandle(self, handle: int) -> int:
        self.open_handles.remove(handle)
        return 1


def resume_with(kernel32: StandInKernel32, pid: int) -> None:
    from app.process.job_object import KillOnClose

    job = object.__new__(KillOnClose)  # its __init__ creates a real job: Windows only
    job._kernel32 = kernel32
    job._resume(pid)


def test_the_suspended_childs_own_thread_is_resumed_and_every_handle_closed():
    kernel32 = StandInKernel32([(7, 40), (8, 41), (9, 41), (10, 42)])
    resume_with(kernel32, 41)
    assert kernel32.resumed == [8, 9] and kernel32.open_handles == set()


@pytest.mark.parametrize(
    ("threads", "opens", "resumes", "said"),
    [
        ([(7, 40), (10, 42)], True, True, "no thread of process 41"),
        ([(8, 41)], False, True, "OpenThread of thread 8"),
        ([(8, 41)], True, False, "ResumeThread of thread 8"),
    ],
    ids=["no-thread-found", "open-fails", "resume-fails"],
)
def test_a_child_that_cannot_be_resumed_is_an_error_not_a_child_left_suspended(
    threads: list[tuple[int, int]], opens: bool, resumes: bool, said: str
):
    """`spawn` kills the child on this error; before, each case returned as if resumed."""
    kernel32 = StandInKernel32(threads, opens=opens, resumes=resumes)
    with pytest.raises(OSError, match=said):
        resume_with(kernel32, 41)
    assert kernel32.open_handles == set() and kernel32.resumed == []
