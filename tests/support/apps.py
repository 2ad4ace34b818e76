"""The local apps the end-to-end tests drive (tests/e2e), each installed into a folder of
its own: the Python ones with pip into a virtual environment (their pinned dependencies
are not vramgate's), the coding agents' CLIs with npm.

`python -m tests.support.apps DIR` installs them all into DIR ahead of the tests, one
after another; with VRAMGATE_TEST_VENVS=DIR the tests then take them from there (CI does
this beside the server's own install, so that the suite does not wait for them). An
install in progress is marked with its process id; a finished one with a second file:
a test that finds one in progress waits for it (tests/support/live.py). Standard library
only: it runs before vramgate is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# name: what pip installs (the command the test runs is the name)
PIP_APPS: dict[str, list[str]] = {
    # torch pinned as vramgate's own install pins it: its CPU build, already on hand
    "open-webui": ["open-webui==0.12.4", "torch==2.13.0"],
    "aider": ["aider-chat==0.86.2"],
    "llm": ["llm==0.36"],
}
# name: the npm package whose command it is
NPM_APPS: dict[str, str] = {
    "claude": "@anthropic-ai/claude-code",
    "codex": "@openai/codex",
}
INSTALLING = ".vramgate-installing"  # holds the installing process's id
COMPLETE = ".vramgate-complete"


def pip_command(venv: Path, command: str) -> Path:
    scripts = venv / ("Scripts" if sys.platform == "win32" else "bin")
    return scripts / (command + (".exe" if sys.platform == "win32" else ""))


def npm_command(where: Path, command: str) -> Path:
    return where / "node_modules" / ".bin" / command


def install_pip(venv: Path, requirements: list[str], command: str) -> str | None:
    """`requirements` into a fresh virtual environment at `venv`; None when `command` is
    there after it, else what went wrong."""

    def make() -> str | None:
        made = subprocess.run(
            [sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True
        )
        if made.returncode != 0:
            return f"no virtual environment for {command}: {made.stderr[-500:]}"
        python = str(pip_command(venv, "python"))
        argv = [python, "-m", "pip", "install", "-q", *requirements]
        return _run_installer(argv, 1800, pip_command(venv, command), " ".join(requirements))

    return _marked(venv, make)


def install_npm(where: Path, package: str, command: str) -> str | None:
    """`package` with npm into `where`; None when `command` is there after it, else what
    went wrong (npm missing among them)."""

    def make() -> str | None:
        npm = shutil.which("npm")
        if npm is None:
            return "npm is not installed"
        argv = [npm, "install", "--prefix", str(where), package]
        return _run_installer(argv, 600, npm_command(where, command), package)

    return _marked(where, make)


def _run_installer(argv: list[str], timeout_s: float, binary: Path, what: str) -> str | None:
    """Run an installer; None when it leaves `binary`, else what went wrong."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"{what} was not installed within {timeout_s:g} s"
    if done.returncode != 0 or not binary.exists():
        return f"{what} could not be installed: {done.stderr[-500:]}"
    return None


BUSY = "another process is installing it"  # what an install that found one under way says


def _marked(folder: Path, make: Callable[[], str | None]) -> str | None:
    """`make` into an emptied `folder`, marked as in progress meanwhile (the mark is made
    only where none of a live process is, so two installers never empty each other's
    folder: the second gets BUSY) and as complete when it succeeded."""
    if not _claim(folder):
        return BUSY
    try:
        for child in folder.iterdir():
            if child.name != INSTALLING:
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        failed = make()
    finally:
        (folder / INSTALLING).unlink(missing_ok=True)
    if failed is None:
        (folder / COMPLETE).write_text("")
    return failed


def _claim(folder: Path) -> bool:
    """Mark `folder` as this process's install, unless a live process's mark is there
    (a mark left by a process that died is taken over)."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / INSTALLING
    for _ in range(2):
        try:
            handle = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if installing(folder):
                return False
            marker.unlink(missing_ok=True)  # its process died half-way
            continue
        with os.fdopen(handle, "w") as out:
            out.write(str(os.getpid()))
        return True
    return False


def installing(folder: Path) -> bool:
    """Whether a live process marks `folder` as its install in progress."""
    try:
        pid = int((folder / INSTALLING).read_text())
    except (OSError, ValueError):
        return False  # no mark, or one being written
    if pid == os.getpid():
        return True
    try:
        import psutil
    except ImportError:  # run ahead, before vramgate (and psutil) is installed: POSIX's way
        return _alive(pid)
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _alive(pid: int) -> bool:
    """Whether `pid` runs (signal 0 asks without sending; an ended child its parent has
    not waited for yet, a zombie, counts as ended)."""
    if os.name != "posix":
        return True  # Windows' os.kill ends the process: leave the mark to its owner
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def installed(folder: Path, binary: Path) -> bool:
    return (folder / COMPLETE).exists() and binary.exists()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.support.apps DIR", file=sys.stderr)
        return 2
    where = Path(argv[0])
    failures = 0
    jobs = [
        (
            name,
            pip_command(where / name, name),
            lambda n=name: install_pip(where / n, PIP_APPS[n], n),
        )
        for name in PIP_APPS
    ]
    jobs += [
        (
            name,
            npm_command(where / name, name),
            lambda n=name: install_npm(where / n, NPM_APPS[n], n),
        )
        for name in NPM_APPS
    ]
    for name, binary, job in jobs:
        if installed(where / name, binary):
            print(f"{name}: installed already", flush=True)
            continue
        started = time.monotonic()
        failed = job()
        took = time.monotonic() - started
        print(f"{name}: {'installed' if failed is None else failed} in {took:.0f} s", flush=True)
        failures += failed is not None
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
