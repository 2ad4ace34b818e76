"""Model lifecycle: load at start, warm up, unload on request, load again on demand.

Loading runs in a worker thread; the registry's states tell the routes what to answer
meanwhile. Warm-up sends a few real requests through the normal path, so the common
buckets have learned prices before the first caller arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from app.errors import ExceedsDevice, OutOfMemory, VramgateError

if TYPE_CHECKING:
    from app.service import InferenceService

log = logging.getLogger("vramgate.lifecycle")


class ModelLifecycle:
    def __init__(self, service: InferenceService) -> None:
        self.service = service
        self.registry = service.registry
        self._loading: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        """Load every model, take the weights baseline, warm each up."""
        service = self.service
        service.state = "loading"
        await self.service.executor.run_in_own_thread(self.registry.load_all)
        service.baseline = service.snapshot(fresh=True).ours_allocated
        service.state = "warming"
        for name, entry in self.registry.entries.items():
            if entry.state == "warming":
                await self.warm(name)
        if service.state == "warming":
            service.state = "ready" if self.registry.all_ready else "degraded"
            service.last_alive = service.clock()
            log.info("server %s; pool %.1f MiB", service.state, service.pool_bytes() / 2**20)

    async def warm(self, name: str) -> None:
        entry = self.registry.entries[name]
        try:
            for inputs in entry.handler.warmup_inputs():
                with contextlib.suppress(OutOfMemory, ExceedsDevice):  # too big here
                    await self.service.exercise(name, entry.handler, inputs)

        except VramgateError as exc:
            entry.state, entry.error = "failed", f"warm-up failed: {exc.message}"
            log.error("model %s %s", name, entry.error)
            return
        entry.state = "ready"

    def ensure_loaded(self, name: str) -> None:
        """A request for an unloaded model starts loading it (the request gets 503)."""
        entry = self.registry.entries.get(name)
        if entry is not None and entry.state == "unloaded" and name not in self._loading:
            self._loading[name] = asyncio.create_task(self.load(name))

    async def load(self, name: str) -> None:
        entry = self.registry.entry(name)
        try:
            if entry.state not in ("unloaded", "failed"):
                return
            if await self.service.executor.run_in_own_thread(self.registry.load, name):
                self.service.baseline += entry.loaded_bytes
                await self.warm(name)
        finally:
            self._loading.pop(name, None)

    async def unload(self, name: str, wait_s: float = 30.0) -> int:
        """Stop admitting the model's jobs, wait for running ones, drop the weights."""
        entry = self.registry.entry(name)
        if entry.state not in ("ready", "warming"):
            return 0
        entry.state = "unloading"
        deadline = self.service.clock() + wait_s
        while self.service.in_flight[name] and self.service.clock() < deadline:
            await asyncio.sleep(0.02)
        freed = await self.service.executor.run_in_own_thread(self.registry.unload, name)
        self.service.baseline = max(0, self.service.baseline - freed)
        return freed

    async def stop(self) -> None:
        for task in list(self._loading.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
