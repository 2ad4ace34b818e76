"""One tray per data folder: a named mutex on Windows (named after the folder), an
exclusive lock file in the folder elsewhere.

The lock lives as long as the process: the operating system releases it when the
process ends, however it ends, so a crashed tray never blocks the next start.
"""

from __future__ import annotations

import contextlib
import hashlib
import ntpath
import os
import sys
from pathlib import Path
from typing import Any

MUTEX_PREFIX = "Local\\vramgate-tray-"  # Local\: this logon session's namespace
ERROR_ALREADY_EXISTS = 183


def mutex_name(data_dir: str) -> str:
    """The mutex of the tray of `data_dir` (a Windows path): a hash of the path as Windows
    compares paths (case-insensitive, either separator, `..` resolved), so the same folder
    however spelled is one tray and two folders are two. A hash, because a kernel object
    name allows no backslash past its namespace and a path may be long."""
    normal = ntpath.normcase(ntpath.normpath(data_dir))
    return MUTEX_PREFIX + hashlib.sha256(normal.encode("utf-8")).hexdigest()[:32]


class InstanceLock:
    def __init__(self, handle: Any) -> None:
        self._handle = handle  # kept open: closing it would release the lock

    def release(self) -> None:
        if sys.platform == "win32":
            import ctypes

            kernel32: Any = ctypes.WinDLL("kernel32")
            kernel32.CloseHandle.argtypes = (ctypes.c_void_p,)
            kernel32.CloseHandle(self._handle)
            return
        with contextlib.suppress(OSError):
            self._handle.close()


def acquire(lock_dir: Path) -> InstanceLock | None:
    """The lock of the data folder `lock_dir`, or None when another tray holds it."""
    if sys.platform == "win32":
        return _acquire_mutex(mutex_name(str(lock_dir.resolve())))
    return _acquire_file(lock_dir / "tray.lock")


def _acquire_mutex(name: str) -> InstanceLock | None:
    if sys.platform != "win32":
        raise OSError("named mutexes are a Windows thing")
    import ctypes

    # use_last_error: ctypes keeps the call's own last error (GetLastError through windll
    # may read one that Python's own calls set since)
    kernel32: Any = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.CreateMutexW.restype = ctypes.c_void_p
    kernel32.CreateMutexW.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_wchar_p)
    kernel32.CloseHandle.argtypes = (ctypes.c_void_p,)
    handle = kernel32.CreateMutexW(None, False, name)
    if not handle or ctypes.get_last_error() == ERROR_ALREADY_EXISTS:
        if handle:
            kernel32.CloseHandle(handle)
        return None
    return InstanceLock(handle)


def _acquire_file(path: Path) -> InstanceLock | None:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return InstanceLock(handle)
