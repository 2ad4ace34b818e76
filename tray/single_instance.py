"""One tray per user: a named mutex on Windows, an exclusive lock file elsewhere.

The lock lives as long as the process: the operating system releases it when the
process ends, however it ends, so a crashed tray never blocks the next start.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

MUTEX_NAME = "Local\\vramgate-tray"
ERROR_ALREADY_EXISTS = 183


class InstanceLock:
    def __init__(self, handle: Any) -> None:
        self._handle = handle  # kept open: closing it would release the lock

    def release(self) -> None:
        if sys.platform == "win32":
            import ctypes

            ctypes.windll.kernel32.CloseHandle(self._handle)
            return
        with contextlib.suppress(OSError):
            self._handle.close()


def acquire(lock_dir: Path) -> InstanceLock | None:
    """The lock, or None when another tray of this user holds it."""
    if sys.platform == "win32":
        return _acquire_mutex()
    return _acquire_file(lock_dir / "tray.lock")


def _acquire_mutex() -> InstanceLock | None:
    if sys.platform != "win32":
        raise OSError("named mutexes are a Windows thing")
    import ctypes

    kernel32 = ctypes.windll.kernel32
    handle = kernel32.CreateMutexW(None, False, MUTEX_NAME)
    if not handle or kernel32.GetLastError() == ERROR_ALREADY_EXISTS:
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
