"""Model lifecycle: load at start, warm up, unload on request, load again on demand.

A load is admitted by the gate like a job, for the bytes its weights will take (file
sizes × the dtype's element size), and runs in a thread of its own as device work: no
job that overlaps it counts as a clean sample. The registry's states tell the routes
what to answer meanwhile. Warm-up sends a few real requests through the normal path, so
the common buckets have learned prices before the first caller arrives. An unload lets
running streams finish; past its bound it ends them with a proper error event, fails
the model's waiting requests with 503, and frees the weights only once nothing runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from app.errors import ExceedsDevice, ModelLoading, OutOfMemory, VramgateError

if TYPE_CHECKING:
    from app.service import InferenceService

log = logging.getLogger("vramgate.lifecycle")

LOAD_POLL_S = 0.02  # how often a request waiting for its model looks again


class ModelLifecycle:
    def __init__(self, service: InferenceService) -> None:
        self.service = service
        self.registry = service.registry
        self._loading: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        """Load every model, take the weights baseline, warm each up."""
        service = self.service
        service.state = "loading"
        for name in self.registry.entries:  # each load sees the weights before it
            await self._load_admitted(name)
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

    async def wait_loaded(self, name: str, deadline: float) -> None:
        """Wait until `name` serves (loading it if unloaded, after an unload under way),
        or has failed, or `deadline` passes; what the registry says then is the answer."""
        entry = self.registry.entries[name]
        while self.service.clock() < deadline and self.service.state in ("ready", "degraded"):
            if entry.state in ("ready", "warming", "failed"):
                return
            self.ensure_loaded(name)
            await asyncio.sleep(LOAD_POLL_S)

    def ensure_loaded(self, name: str) -> None:
        """A request for an unloaded model starts loading it (and waits: `wait_loaded`)."""
        entry = self.registry.entries.get(name)
        if entry is not None and entry.state == "unloaded" and name not in self._loading:
            self._loading[name] = asyncio.create_task(self.load(name))

    async def _load_admitted(self, name: str) -> bool:
        """Load one model once the gate admits its expected weight bytes."""
        service, entry = self.service, self.registry.entry(name)
        entry.state, entry.error = "loading", None
        expected = entry.handler.expected_weights_bytes(service.device)
        try:
            permit = await service.admit_load(name, expected)
        except VramgateError as exc:
            entry.state, entry.error = "failed", f"cannot load: {exc.message}"
            log.error("model %s %s", name, entry.error)
            return False
        try:
            loaded, alone = await service.executor.run_load(self.registry.load, name)
        finally:
            service.release(permit)
        if loaded and not alone:  # jobs ran meanwhile: our growth is not all weights
            entry.loaded_bytes = entry.weights_bytes
        return bool(loaded)

    async def load(self, name: str) -> None:
        entry = self.registry.entry(name)
        try:
            if entry.state not in ("unloaded", "failed"):
                return
            if await self._load_admitted(name):
                self.service.baseline += entry.loaded_bytes
                await self.warm(name)
        finally:
            self._loading.pop(name, None)

    async def unload(self, name: str, wait_s: float = 30.0) -> int:
        """Stop admitting the model's jobs, let running ones finish for `wait_s`, then end
        the rest properly (streams get an error event, waiting requests 503) and drop the
        weights once nothing of the model runs."""
        service, entry = self.service, self.registry.entry(name)
        if entry.state not in ("ready", "warming"):
            return 0
        entry.state = "unloading"
        deadline = service.clock() + wait_s
        while service.in_flight[name] and service.clock() < deadline:
            await asyncio.sleep(0.02)
        if service.in_flight[name]:
            ended = ModelLoading(
                f"model {name!r} was unloaded; the answer is incomplete", retry_after=2
            )
            service.end_model_work(name, ended)
            give_up = service.clock() + service.settings.run_timeout
            while service.runner.running_for(name) and service.clock() < give_up:
                await asyncio.sleep(0.02)
            if service.runner.running_for(name):  # a wedged thread still uses the weights
                log.error("model %s not unloaded: a job of it does not come back", name)
                entry.state = "ready"
                return 0
        freed, _ = await service.executor.run_load(self.registry.unload, name)
        service.baseline = max(0, service.baseline - freed)
        return freed

    async def stop(self) -> None:
        for task in list(self._loading.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
