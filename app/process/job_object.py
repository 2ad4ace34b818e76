"""Windows: a job object that kills its processes when its last handle closes.

The tray holds one for its server, and every server (under the tray or run headless as
`vramgate serve`) one for its llama.cpp runners: when the holder ends however it ends
(Quit, a crash, the task manager), Windows closes the handle and kills what the job
holds, as `PR_SET_PDEATHSIG` does on Linux. A child is held from its first instruction:
it is created suspended, assigned, then resumed (`KillOnClose.spawn`), and what it starts
is born in the job (a job's processes' children join it; nested jobs since Windows 8).
Structures as winnt.h and tlhelp32.h define them; their layout is checked on every OS
(`tests/process/test_job_object.py`).
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
import sys
import threading
from typing import Any

log = logging.getLogger("vramgate.job")
JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x2000
JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS = 9  # JobObjectExtendedLimitInformation
CREATE_SUSPENDED = 0x4  # winbase.h
TH32CS_SNAPTHREAD = 0x4  # tlhelp32.h
THREAD_SUSPEND_RESUME = 0x2  # winnt.h
INVALID_HANDLE_VALUE = ctypes.c_void_p(-1).value
RESUME_FAILED = 0xFFFFFFFF  # ResumeThread's (DWORD)-1


class IoCounters(ctypes.Structure):
    _fields_ = [
        ("ReadOperationCount", ctypes.c_uint64),
        ("WriteOperationCount", ctypes.c_uint64),
        ("OtherOperationCount", ctypes.c_uint64),
        ("ReadTransferCount", ctypes.c_uint64),
        ("WriteTransferCount", ctypes.c_uint64),
        ("OtherTransferCount", ctypes.c_uint64),
    ]


class BasicLimitInformation(ctypes.Structure):  # JOBOBJECT_BASIC_LIMIT_INFORMATION
    _fields_ = [
        ("PerProcessUserTimeLimit", ctypes.c_int64),  # LARGE_INTEGER
        ("PerJobUserTimeLimit", ctypes.c_int64),
        ("LimitFlags", ctypes.c_uint32),  # DWORD
        ("MinimumWorkingSetSize", ctypes.c_size_t),  # SIZE_T
        ("MaximumWorkingSetSize", ctypes.c_size_t),
        ("ActiveProcessLimit", ctypes.c_uint32),
        ("Affinity", ctypes.c_size_t),  # ULONG_PTR
        ("PriorityClass", ctypes.c_uint32),
        ("SchedulingClass", ctypes.c_uint32),
    ]


class ExtendedLimitInformation(ctypes.Structure):  # JOBOBJECT_EXTENDED_LIMIT_INFORMATION
    _fields_ = [
        ("BasicLimitInformation", BasicLimitInformation),
        ("IoInfo", IoCounters),
        ("ProcessMemoryLimit", ctypes.c_size_t),
        ("JobMemoryLimit", ctypes.c_size_t),
        ("PeakProcessMemoryUsed", ctypes.c_size_t),
        ("PeakJobMemoryUsed", ctypes.c_size_t),
    ]


class ThreadEntry32(ctypes.Structure):  # THREADENTRY32
    _fields_ = [
        ("dwSize", ctypes.c_uint32),
        ("cntUsage", ctypes.c_uint32),
        ("th32ThreadID", ctypes.c_uint32),
        ("th32OwnerProcessID", ctypes.c_uint32),
        ("tpBasePri", ctypes.c_int32),  # LONG
        ("tpDeltaPri", ctypes.c_int32),
        ("dwFlags", ctypes.c_uint32),
    ]


def kill_on_close_limits() -> ExtendedLimitInformation:
    info = ExtendedLimitInformation()
    info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
    return info


class KillOnClose:
    """A job object whose processes die when the handle closes (with this process).
    Windows only; raises OSError if Windows refuses (the supervisor logs it and runs
    the child anyway)."""

    def __init__(self) -> None:
        kernel32: Any = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        kernel32.CreateJobObjectW.restype = ctypes.c_void_p
        kernel32.CreateJobObjectW.argtypes = (ctypes.c_void_p, ctypes.c_wchar_p)
        kernel32.SetInformationJobObject.argtypes = (
            ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32,
        )  # fmt: skip
        kernel32.AssignProcessToJobObject.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
        kernel32.CreateToolhelp32Snapshot.restype = ctypes.c_void_p
        kernel32.CreateToolhelp32Snapshot.argtypes = (ctypes.c_uint32, ctypes.c_uint32)
        kernel32.Thread32First.argtypes = (ctypes.c_void_p, ctypes.POINTER(ThreadEntry32))
        kernel32.Thread32Next.argtypes = (ctypes.c_void_p, ctypes.POINTER(ThreadEntry32))
        kernel32.OpenThread.restype = ctypes.c_void_p
        kernel32.OpenThread.argtypes = (ctypes.c_uint32, ctypes.c_int, ctypes.c_uint32)
        kernel32.ResumeThread.restype = ctypes.c_uint32
        kernel32.ResumeThread.argtypes = (ctypes.c_void_p,)
        kernel32.CloseHandle.argtypes = (ctypes.c_void_p,)
        self._kernel32 = kernel32
        self.handle = kernel32.CreateJobObjectW(None, None)
        if not self.handle:
            raise ctypes.WinError(ctypes.get_last_error())  # type: ignore[attr-defined]
        info = kill_on_close_limits()
        if not kernel32.SetInformationJobObject(
            self.handle,
            JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS,
            ctypes.byref(info),
            ctypes.sizeof(info),
        ):
            raise ctypes.WinError(ctypes.get_last_error())  # type: ignore[attr-defined]

    def assign(self, child: subprocess.Popen[Any]) -> None:
        process = int(child._handle)  # type: ignore[attr-defined]  # Popen's process handle
        if not self._kernel32.AssignProcessToJobObject(self.handle, process):
            raise ctypes.WinError(ctypes.get_last_error())  # type: ignore[attr-defined]

    def spawn(self, argv: list[str], **popen: Any) -> subprocess.Popen[Any]:
        """`subprocess.Popen(argv, **popen)`, in this job from its first instruction:
        created suspended, assigned, resumed. A job Windows refuses is logged and the
        child runs anyway (outside it)."""
        flags = popen.pop("creationflags", 0) | CREATE_SUSPENDED
        child: subprocess.Popen[Any] = subprocess.Popen(argv, creationflags=flags, **popen)
        try:
            self.assign(child)
        except OSError as exc:
            log.warning("%s runs outside the job object: %s", argv[0], exc)
        try:
            self._resume(child.pid)
        except OSError:  # never leave a child suspended for good
            child.kill()
            child.wait()
            raise
        return child

    def _resume(self, pid: int) -> None:
        """Resume the threads of `pid` (a process created suspended has one; Popen closed
        its handle, so it is found by a snapshot of the system's threads). Raises OSError
        unless at least one thread was found and every one found was resumed: a thread
        that cannot be opened or resumed would leave the child suspended for good."""
        k = self._kernel32
        snapshot = k.CreateToolhelp32Snapshot(TH32CS_SNAPTHREAD, 0)
        if not snapshot or snapshot == INVALID_HANDLE_VALUE:
            raise last_error("CreateToolhelp32Snapshot")
        resumed = 0
        try:
            entry = ThreadEntry32(dwSize=ctypes.sizeof(ThreadEntry32))
            more = k.Thread32First(snapshot, ctypes.byref(entry))
            while more:
                if entry.th32OwnerProcessID == pid:
                    thread = k.OpenThread(THREAD_SUSPEND_RESUME, False, entry.th32ThreadID)
                    if not thread:
                        raise last_error(f"OpenThread of thread {entry.th32ThreadID}")
                    try:
                        if k.ResumeThread(thread) == RESUME_FAILED:
                            raise last_error(f"ResumeThread of thread {entry.th32ThreadID}")
                    finally:
                        k.CloseHandle(thread)
                    resumed += 1
                more = k.Thread32Next(snapshot, ctypes.byref(entry))
        finally:
            k.CloseHandle(snapshot)
        if not resumed:
            raise OSError(f"no thread of process {pid} was found to resume")


def last_error(call: str) -> OSError:
    """The error of the Win32 `call` that just failed, from the thread's last error
    (Windows only has it: elsewhere, as on a test's stand-in kernel32, just the call)."""
    if sys.platform != "win32":
        return OSError(f"{call} failed")
    code = ctypes.get_last_error()  # type: ignore[attr-defined]
    return OSError(code, f"{call} failed: {ctypes.FormatError(code)}")  # type: ignore[attr-defined]


_own: list[KillOnClose | None] = []  # this process's job for its children, made once
_own_lock = threading.Lock()  # guards _own


def own_job() -> KillOnClose | None:
    """This process's kill-on-close job for the children it starts (Windows), or None
    (elsewhere, or where Windows refused one: said once in the log)."""
    with _own_lock:
        if not _own:
            job = None
            if sys.platform == "win32":
                try:
                    job = KillOnClose()
                except OSError as exc:
                    log.warning("no job object: children will not end with this process: %s", exc)
            _own.append(job)
        return _own[0]


def popen_held(argv: list[str], **popen: Any) -> subprocess.Popen[Any]:
    """A child that ends when this process ends however it ends: held by `own_job` from
    its first instruction on Windows; elsewhere a plain Popen (the caller's own means:
    PR_SET_PDEATHSIG, or a runner's watch of its stdin and parent)."""
    job = own_job()
    if job is None:
        return subprocess.Popen(argv, **popen)
    return job.spawn(argv, **popen)
