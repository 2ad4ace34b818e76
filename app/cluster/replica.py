"""One replica of the cluster: the whole single-machine server, answering the ingress.

Each replica builds vramgate's own app from the settings the driver resolved (so every
replica serves the same models with the same bounds) and runs its lifespan: its own
device (the GPU Ray gave it: Ray sets CUDA_VISIBLE_DEVICES, and `device = "auto"` takes
what is visible), gate, queue and learned prices. Requests come in through
`app.cluster.asgi` and meet the same guard, validation and gate as over a socket.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from app.api.app import create_app
from app.cluster.asgi import Forwarded, Head, answer
from app.config.settings import Settings
from app.core.fleet.fleet import Fleet

log = logging.getLogger("vramgate.cluster")

REPLICA_HEADER = "x-vramgate-replica"


class Replica:
    async def __init__(self, settings: Settings) -> None:  # type: ignore[misc]  # Ray's own
        self._failed = False
        self.id = serve.get_replica_context().replica_id.unique_id
        self._app = create_app(settings, on_fatal=self._fatal)
        self._fleet: Fleet = self._app.state.fleet
        self._lifespan = contextlib.AsyncExitStack()
        await self._lifespan.enter_async_context(self._app.router.lifespan_context(self._app))
        log.info("replica %s (pid %d) serves on %s", self.id, os.getpid(), self._devices())

    def _fatal(self) -> None:
        """A fatal device error: the health check fails, and Ray Serve replaces the
        replica (as the tray restarts a single server)."""
        self._failed = True

    def _devices(self) -> list[str]:
        return [f"{lane.device.id} ({lane.device.name})" for lane in self._fleet.lanes]

    async def answer(self, request: Forwarded, **routing: Any) -> AsyncIterator[Head | bytes]:
        """The app's answer, head first, naming this replica. `routing`: the router's
        keyword arguments (app.cluster.router), nothing the app needs."""
        async for part in answer(self._app, request):
            if isinstance(part, Head):
                part.headers.append((REPLICA_HEADER.encode(), self.id.encode()))
            yield part

    async def answer_whole(self, request: Forwarded, **routing: Any) -> tuple[Head, bytes]:
        """The same answer in one piece: one call to the ingress instead of one per
        chunk, for a request whose answer does not stream."""
        parts = [part async for part in self.answer(request)]
        head = parts[0]
        assert isinstance(head, Head)
        return head, b"".join(part for part in parts[1:] if isinstance(part, bytes))

    async def record_routing_stats(self) -> dict[str, Any]:
        """This replica's own figures for the ingress's router: for each model it serves,
        the most bytes one of its devices could admit now and the model's largest learned
        price; its tickets waiting and running. A coroutine, so that it reads the
        server's state on the server's own event loop (Ray may run a plain method on
        another thread)."""
        fleet = self._fleet
        prices: dict[str, int] = {}
        for row in fleet.book.snapshot():
            if row["price_bytes"] is not None:
                prices[row["model"]] = max(prices.get(row["model"], 0), int(row["price_bytes"]))
        models: dict[str, dict[str, int]] = {}
        for lane in fleet.lanes:
            free = lane.scheduler.gate.free_bytes()
            for name, entry in lane.registry.entries.items():
                if entry.retired:
                    continue
                best = models.setdefault(
                    name, {"free_bytes": 0, "price_bytes": prices.get(name, 0)}
                )
                best["free_bytes"] = max(best["free_bytes"], free)
        view = fleet.view()
        return {
            "replica": self.id,
            "pid": os.getpid(),
            "free_bytes": max(lane.scheduler.gate.free_bytes() for lane in fleet.lanes),
            "queued": view.depth + view.running + view.running_streams,
            "ready": fleet.ready,
            "models": models,
        }

    def check_health(self) -> None:
        if self._failed:
            raise RuntimeError("the device failed: this replica must be replaced")

    async def __del__(self) -> None:
        await self._lifespan.aclose()
