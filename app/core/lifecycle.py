"""Model lifecycle: load at start, warm up, unload on request, load again on demand.

A load is admitted by the gate like a job, for the bytes its weights will take (file
sizes × the dtype's element size), and runs in a thread of its own as device work: no
job that overlaps it counts as a clean sample. The registry's states tell the routes
what to answer meanwhile. Warm-up (injected: the service sends a few real requests
through the normal path) gives the common buckets learned prices before the first caller
arrives. An unload lets running streams finish; past its bound it ends them with a
proper error event, fails the model's waiting requests with 503, and frees the weights
only once nothing runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial

from app.core.keep_alive import InFlight, KeepAlive
from app.core.memory import MemoryView
from app.core.scheduler import Scheduler
from app.core.state import ServerState
from app.engine.executor import Executor
from app.errors import ModelLoading, VramgateError
from app.models.base import ModelHandler
from app.models.registry import ModelRegistry

log = logging.getLogger("vramgate.lifecycle")

LOAD_POLL_S = 0.02  # how often a request waiting for its model looks again
WarmUp = Callable[[str, ModelHandler], Awaitable[None]]


class ModelLifecycle:
    def __init__(
        self,
        registry: ModelRegistry,
        scheduler: Scheduler,
        executor: Executor,
        memory: MemoryView,
        state: ServerState,
        *,
        warm_up: WarmUp,
        in_flight: InFlight,
        run_timeout: float,
        clock: Callable[[], float],
        keep_alive_s: float = -1.0,
        on_unloaded: Callable[[str, str], None] = lambda model, reason: None,
    ) -> None:
        """`warm_up` runs a model's warm-up requests (raising VramgateError if they
        fail); `in_flight` counts each model's requests between admission and reply;
        `keep_alive_s` is how long an idle model stays (-1: for good) unless its config
        says otherwise; `on_unloaded(model, reason)` counts unloads."""
        self.registry = registry
        self._scheduler = scheduler
        self._executor = executor
        self._memory = memory
        self._state = state
        self._warm_up = warm_up
        self._in_flight = in_flight
        self._run_timeout = run_timeout
        self._clock = clock
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._on_unloaded = on_unloaded
        self.keep_alive = KeepAlive(partial(self._own_keep_alive, keep_alive_s), in_flight)
        self._unloading: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def _own_keep_alive(self, default_s: float, name: str) -> float:
        entry = self.registry.entries.get(name)
        own = entry.handler.spec.keep_alive if entry is not None else None
        return default_s if own is None else own

    def unload_idle(self) -> list[str]:
        """Start unloading every loaded model idle past its keep-alive (housekeeping)."""
        now = self._clock()
        ready = [n for n, e in self.registry.entries.items() if e.state == "ready"]
        expired = [n for n in self.keep_alive.expired(ready, now) if n not in self._unloading]
        for name in expired:
            self._unloading.add(name)
            task = asyncio.create_task(self._unload_idle(name), name=f"keep-alive {name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return expired

    async def _unload_idle(self, name: str) -> None:
        try:
            left = self.keep_alive.left(name, self._clock())
            if left is None or left > 0:  # a request came since: it keeps the model
                return
            await self.unload(name, wait_s=0.0)  # marks it unloading before any await
            if self.registry.entries[name].state == "unloaded":
                log.info("model %s unloaded: idle past its keep-alive", name)
                self._on_unloaded(name, "keep_alive")
        finally:
            self._unloading.discard(name)

    async def start(self) -> None:
        """Load every model, take the weights baseline, warm each up."""
        self._state.phase = "loading"
        for index, (name, entry) in enumerate(self.registry.entries.items()):
            policy = entry.handler.spec.load or ("startup" if index == 0 else "demand")
            if policy == "demand":
                entry.state = "unloaded"  # its first request loads it
                continue
            await self._load_admitted(name)  # each load sees the weights before it
            self._memory.baseline = self._memory.snapshot(fresh=True).ours_allocated
        self._state.phase = "warming"
        for name, entry in self.registry.entries.items():
            if entry.state == "warming":
                await self.warm(name)
                self.keep_alive.loaded(name, self._clock())
        if self._state.phase == "warming":
            self._state.phase = "ready" if self.registry.all_ready else "degraded"
            pool = self._memory.pool_bytes() / 2**20
            log.info("server %s; pool %.1f MiB", self._state.phase, pool)

    async def warm(self, name: str) -> None:
        entry = self.registry.entries[name]
        try:
            await self._warm_up(name, entry.handler)
        except VramgateError as exc:
            entry.state, entry.error = "failed", f"warm-up failed: {exc.message}"
            log.error("model %s %s", name, entry.error)
            return
        entry.state = "ready"

    async def wait_loaded(self, name: str, deadline: float) -> None:
        """Wait until `name` serves (loading it if unloaded, after an unload under way),
        or has failed, or `deadline` passes; what the registry says then is the answer."""
        entry = self.registry.entries[name]
        while self._clock() < deadline and self._state.serving:
            if entry.state in ("ready", "warming", "failed"):
                return
            self.ensure_loaded(name)
            await asyncio.sleep(LOAD_POLL_S)

    def ensure_loaded(self, name: str) -> None:
        """A request for an unloaded model starts loading it (and waits: `wait_loaded`)."""
        entry = self.registry.entries.get(name)
        if entry is not None and entry.state == "unloaded" and name not in self._loading:
            self._loading[name] = asyncio.create_task(self.load(name))

    def away(self, name: str) -> bool:
        """Whether a request for `name` must first wait for it: a model being unloaded
        or loaded is waited for, and an unloaded one is loaded, as a request waits for
        memory in the queue."""
        entry = self.registry.entries.get(name)
        return entry is not None and entry.state not in ("ready", "warming")

    async def _load_admitted(self, name: str) -> bool:
        """Load one model once the gate admits its expected weight bytes."""
        entry = self.registry.entry(name)
        entry.state, entry.error = "loading", None
        expected = entry.handler.expected_weights_bytes(self._memory.device)
        try:
            permit = await self._scheduler.admit_load(name, expected)
        except VramgateError as exc:
            entry.state, entry.error = "failed", f"cannot load: {exc.message}"
            log.error("model %s %s", name, entry.error)
            return False
        try:
            loaded, alone = await self._executor.run_load(self.registry.load, name)
        finally:
            self._scheduler.release(permit)
        if loaded and not alone:  # jobs ran meanwhile: our growth is not all weights
            entry.loaded_bytes = entry.weights_bytes
        return bool(loaded)

    async def load(self, name: str) -> None:
        entry = self.registry.entry(name)
        try:
            if entry.state not in ("unloaded", "failed"):
                return
            if await self._load_admitted(name):
                self._memory.baseline += entry.loaded_bytes
                await self.warm(name)
                self.keep_alive.loaded(name, self._clock())
        finally:
            self._loading.pop(name, None)

    async def unload(self, name: str, wait_s: float = 30.0) -> int:
        """Stop admitting the model's jobs, let running ones finish for `wait_s`, then end
        the rest properly (streams get an error event, waiting requests 503) and drop the
        weights once nothing of the model runs."""
        entry = self.registry.entry(name)
        if entry.state not in ("ready", "warming"):
            return 0
        entry.state = "unloading"
        deadline = self._clock() + wait_s
        while self._in_flight[name] and self._clock() < deadline:
            await asyncio.sleep(0.02)
        if self._in_flight[name] and not await self._end_work(name):
            entry.state = "ready"
            return 0
        freed, _ = await self._executor.run_load(self.registry.unload, name)
        self._memory.baseline = max(0, self._memory.baseline - freed)
        return freed

    async def _end_work(self, name: str) -> bool:
        """End the model's queued and running work; False if a run does not come back."""
        ended = ModelLoading(
            f"model {name!r} was unloaded; the answer is incomplete", retry_after=2
        )
        self._scheduler.end_model_work(name, ended)
        give_up = self._clock() + self._run_timeout
        while self._scheduler.running_for(name) and self._clock() < give_up:
            await asyncio.sleep(0.02)
        if self._scheduler.running_for(name):  # a wedged thread still uses the weights
            log.error("model %s not unloaded: a job of it does not come back", name)
            return False
        return True

    async def stop(self) -> None:
        for task in [*self._loading.values(), *self._tasks]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
