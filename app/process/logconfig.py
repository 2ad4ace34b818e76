"""One logging configuration for vramgate and uvicorn: console + rotating file.

Every warning carries a device snapshot, so a log read after the fact shows what the
memory looked like when something went wrong.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
from collections.abc import Callable
from pathlib import Path

from app.config.settings import Settings
from app.process import streams

LOG_FILE = "server.log"
_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
_snapshot: Callable[[], str] | None = None  # set once the device exists


def set_snapshot_provider(provider: Callable[[], str] | None) -> None:
    global _snapshot
    _snapshot = provider


class DeviceSnapshotFilter(logging.Filter):
    """Appends the device snapshot to WARNING and worse."""

    def filter(self, record: logging.LogRecord) -> bool:
        # A record reaches this filter once per handler; decorate it only the first time.
        decorated = getattr(record, "device_snapshot", None) is not None
        if record.levelno >= logging.WARNING and _snapshot is not None and not decorated:
            try:
                snapshot = _snapshot()
            except Exception as exc:  # a log line must never fail for its decoration
                snapshot = f"unavailable ({exc})"
            record.__dict__["device_snapshot"] = snapshot
            record.msg = f"{record.msg} [device: {snapshot}]"
        return True


def configure_logging(settings: Settings) -> Path:
    """Install the handlers; returns the log file's path."""
    log_dir = settings.resolved_log_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / LOG_FILE
    formatter = logging.Formatter(_FORMAT)
    snapshot = DeviceSnapshotFilter()
    handlers: list[logging.Handler] = [
        logging.handlers.RotatingFileHandler(
            path, maxBytes=10 * 2**20, backupCount=5, encoding="utf-8"
        )
    ]
    if sys.stderr is not None and not streams.replaced:  # none in a windowed executable
        handlers.append(logging.StreamHandler(sys.stderr))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.addFilter(snapshot)
        root.addHandler(handler)
    root.setLevel(settings.log_level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    for noisy in ("httpx", "httpcore", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return path
