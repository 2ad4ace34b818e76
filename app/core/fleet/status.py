"""A served model as the routes read it: typed, from the /status row its copies make up
(which holds more: prices, the engine's own figures). Routes read this, never the row's
keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelStatus:
    name: str
    state: str  # the best of its copies': ready, warming, loading, unloaded, failed, ...
    loaded: bool
    retired: bool  # taken out of the config: it serves nothing and goes once unloaded
    weights_bytes: int  # what its copies hold together
    error: str | None
    keep_alive_s: float | None  # how long it stays idle (None: for good)
    unloads_in_s: float | None  # None: busy (its keep-alive starts when idle), or unloaded
    context: int | None  # a runner's cells a request may use
    path: str  # the file it was loaded from, where its engine says
    # a runner's memory as measured: (on the device, in RAM), or None
    measured: tuple[int, int] | None
    row: dict[str, Any]  # the /status row itself

    @classmethod
    def of(cls, row: dict[str, Any]) -> ModelStatus:
        measured = row.get("measured")
        return cls(
            name=row["name"],
            state=row["state"],
            loaded=bool(row["loaded"]),
            retired=bool(row["retired"]),
            weights_bytes=int(row["weights_bytes"]),
            error=row.get("error"),
            keep_alive_s=row.get("keep_alive_s"),
            unloads_in_s=row.get("unloads_in_s"),
            context=row.get("context"),
            path=str(row.get("path", "")),
            measured=(
                (int(measured["device_bytes"]), int(measured["host_bytes"])) if measured else None
            ),
            row=row,
        )
