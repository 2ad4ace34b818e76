"""The server's own state, small and shared: the lifecycle and the service write it,
/health, /status and the tray read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Phase = Literal["starting", "loading", "warming", "ready", "degraded", "stopping", "failed"]


@dataclass
class ServerState:
    phase: Phase = "starting"
    paused: bool = False  # the tray's "Pause new requests": new work gets 503
    exit_code: int = 0  # what the process should exit with after a fatal error
    stop_deadline: float | None = None  # set once a stop was asked for

    @property
    def serving(self) -> bool:
        """Started, and neither stopping nor failed."""
        return self.phase in ("ready", "degraded")

    @property
    def ending(self) -> bool:
        return self.phase in ("stopping", "failed")
