"""A windowed executable (the bundle's double-click `vramgate.exe`) has no stdout or
stderr: Python sets both to None, and the first print, progress bar or `--help` would
fail. `ensure_streams` gives such a process a file in the log folder instead, so that
output is never written to a missing stream (the console executable, `vramgate-cli`,
prints to its console as usual)."""

from __future__ import annotations

import sys
from pathlib import Path

import platformdirs

CONSOLE_LOG = "console.log"
replaced = False  # the streams are this module's file, not a console (logging skips them)


def ensure_streams(log_dir: Path | None = None) -> Path | None:
    """Point a missing stdout or stderr at LOG_DIR/console.log; returns that file if so."""
    global replaced
    if sys.stdout is not None and sys.stderr is not None:
        return None
    folder = log_dir or Path(platformdirs.user_log_dir("vramgate", appauthor=False))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CONSOLE_LOG
    stream = path.open("a", encoding="utf-8", buffering=1)  # lives as long as the process
    if sys.stdout is None:
        sys.stdout = stream
    if sys.stderr is None:
        sys.stderr = stream
    replaced = True
    return path
