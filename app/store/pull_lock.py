"""One pull of a Hub repo at a time, across processes: `vramgate pull` in a terminal and
the server's `/admin/models/pull` (or two terminals) share the repo's partial folder,
where one would delete what the other is still writing.

The lock is a file beside that folder (`pull-partial/ORG--NAME.lock`), locked by the
operating system (`flock` on Linux and macOS, `msvcrt.locking` on Windows), so a pull that
dies, however it dies, releases it. Beside it, `ORG--NAME.pulling` says who holds it (its
process id, its command, since when): a second pull waits, and says whom it waits for.
The holder deletes both when it is done, so a models folder with no pull under way holds
no `pull-partial` at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from app.store.progress import Progress

PARTIAL = "pull-partial"  # beside the models; `pull-` folders are no models (folders.py)
POLL_S = 0.5  # how often a waiting pull tries the lock
REMIND_S = 60.0  # how often a waiting pull says it still waits


def partial_root(models_dir: Path) -> Path:
    return models_dir / PARTIAL


def repo_key(repo: str) -> str:
    """`ORG/NAME` as one folder name: `ORG--NAME`."""
    return repo.replace("/", "--")


@contextlib.contextmanager
def one_pull_of(
    repo: str, models_dir: Path, progress: Progress, poll_s: float = POLL_S
) -> Iterator[None]:
    """Held while this process pulls `repo` into `models_dir`; waits (saying whom for)
    while another process, or another thread, holds it."""
    root = partial_root(models_dir)
    lock, note = root / f"{repo_key(repo)}.lock", root / f"{repo_key(repo)}.pulling"
    fd = _try(lock)
    if fd is None:
        waited, said = time.monotonic(), -REMIND_S
        while fd is None:
            if time.monotonic() - said >= REMIND_S:
                said = time.monotonic()
                progress.step(_waiting(repo, note, round(said - waited)))
            time.sleep(poll_s)
            fd = _try(lock)
        progress.step(f"the other pull of {repo} has ended; this one goes on")
    try:
        note.write_text(json.dumps(_holder()), encoding="utf-8")
        yield
    finally:
        with contextlib.suppress(OSError):
            note.unlink()
        _release(fd, lock)
        with contextlib.suppress(OSError):  # not empty: another repo's pull, or its rest
            root.rmdir()


def _holder() -> dict[str, object]:
    return {"pid": os.getpid(), "command": " ".join(sys.argv), "since": time.time()}


def _waiting(repo: str, note: Path, waited_s: int) -> str:
    """What a waiting pull says: whom it waits for, as the holder wrote it."""
    try:
        holder = json.loads(note.read_text(encoding="utf-8"))
        since = time.strftime("%H:%M:%S", time.localtime(float(holder["since"])))
        who = f"process {int(holder['pid'])} ({holder['command']}), since {since}"
    except (OSError, ValueError, KeyError, TypeError):  # between its lock and its note
        who = "another process"
    after = f" (waited {waited_s} s)" if waited_s else ""
    return f"another pull of {repo} is under way, by {who}: waiting for it to end{after}"


def _try(lock: Path) -> int | None:
    """The lock file's descriptor, locked; None while another holds it."""
    while True:
        lock.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            break
        except FileNotFoundError:  # the pull before has just removed the folder: again
            continue
    try:
        if not _lock(fd):
            os.close(fd)
            return None
        if sys.platform != "win32":
            # the holder before deletes the file while it holds it: a lock taken on the
            # file it deleted is no lock on the file the next pull creates
            try:
                named = os.stat(lock)
            except FileNotFoundError:
                os.close(fd)
                return None
            if (named.st_dev, named.st_ino) != (os.fstat(fd).st_dev, os.fstat(fd).st_ino):
                os.close(fd)
                return None
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return fd


def _lock(fd: int) -> bool:
    if sys.platform == "win32":
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _release(fd: int, lock: Path) -> None:
    if sys.platform == "win32":
        import msvcrt

        with contextlib.suppress(OSError):
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        os.close(fd)
        with contextlib.suppress(OSError):  # a waiter has it open: it stays, and is reused
            lock.unlink()
        return
    with contextlib.suppress(OSError):
        lock.unlink()  # while held: a waiter that locks it after sees it is gone
    os.close(fd)
