"""Model lifecycle: load at start or on demand, warm up, unload, load again on demand.

A load is admitted by the gate like a job, for the bytes its weights will take (file
sizes × the dtype's element size) plus the headroom jobs keep, and runs in a thread of
its own as device work: no job that overlaps it counts as a clean sample. The registry's
states tell the routes what to answer meanwhile. Warm-up (injected: the service sends a
few real requests through the normal path) gives the common buckets learned prices
before the first caller arrives. Idle models are unloaded past their keep-alive, when a
waiting ticket needs the memory they hold, and when other programs take memory
(app.core.lifecycle.eviction decides which). An unload asked for lets running streams finish;
past its bound it ends them with a proper error event, fails the model's waiting
requests with 503, and frees the weights only once nothing runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from app.config.settings import ModelSpec
from app.core.lifecycle import eviction
from app.core.lifecycle.cache_return import CacheReturn
from app.core.lifecycle.keep_alive import InFlight, KeepAlive
from app.core.lifecycle.registry import ModelRegistry
from app.core.memory import MemoryView
from app.core.scheduler import Scheduler
from app.core.state import ServerState
from app.devices.executor import Executor
from app.errors import ExceedsDevice, ModelEvicted, ModelLoading, VramgateError
from app.models.base import ModelHandler

log = logging.getLogger("vramgate.lifecycle")

LOAD_POLL_S = 0.02  # how often a request waiting for its model looks again
PRESSURE_MARGIN = 64 * 2**20  # the pool moving this little is noise, not another program
WarmUp = Callable[[str, ModelHandler], Awaitable[None]]


@dataclass(frozen=True)
class GaveBack:
    """Memory given back to other programs: how much, by unloading which, when (epoch)."""

    nbytes: int
    models: tuple[str, ...]
    at: float


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
        headroom: int = 0,
        on_unloaded: Callable[[str, eviction.Reason], None] = lambda model, reason: None,
    ) -> None:
        """`warm_up` runs a model's warm-up requests (raising VramgateError if they
        fail); `in_flight` counts each model's requests between admission and reply;
        `keep_alive_s` is how long an idle model stays (-1: for good) unless its config
        says otherwise; `headroom`: the bytes jobs keep beside the weights (a load needs
        them free; idle models give memory back to other programs to keep them);
        `on_unloaded(model, reason)` counts unloads."""
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
        self.headroom = headroom
        self._freeing: dict[str, int] = {}  # models being unloaded: the bytes they hold
        self._tasks: set[asyncio.Task[None]] = set()
        self.gave_back: GaveBack | None = None  # the last memory given to other programs
        self._retiring: dict[str, ModelSpec | None] = {}  # going once idle (None: for good)
        # The most our own models have left jobs since our last load or unload (less a
        # margin): a pool below the headroom by our own doing is no other program's; a
        # pool that falls below this is
        self._settled_pool = headroom
        self._cache = CacheReturn(memory, executor, clock)

    def _own_keep_alive(self, default_s: float, name: str) -> float:
        entry = self.registry.entries.get(name)
        own = entry.handler.spec.keep_alive if entry is not None else None
        return default_s if own is None else own

    def unload_idle(self) -> list[str]:
        """Unload every loaded model idle past its keep-alive, and forget the kept
        prefixes unused for as long (housekeeping)."""
        now = self._clock()
        ready = [n for n, e in self.registry.entries.items() if e.state == "ready"]
        for name in ready:
            seconds = self.keep_alive.seconds(name)
            if not math.isinf(seconds):
                self.registry.store.expire(name, seconds)
        expired = [n for n in self.keep_alive.expired(ready, now) if n not in self._freeing]
        for name in expired:
            self._evict(name, "keep_alive")
        return expired

    def reap(self) -> list[str]:
        """Models whose runner process ended by itself (housekeeping): once their last
        request has failed, they are unloaded, and the next request loads them again;
        /status says why meanwhile. No respawn loop: crash-only."""
        reaped = []
        for name, entry in self.registry.entries.items():
            if entry.state != "ready" or name in self._freeing:
                continue
            code = entry.handler.exited()
            if code is None or self._scheduler.running_for(name):
                continue
            entry.error = f"its runner exited with code {code}; it loads again on demand"
            log.error("model %s: %s", name, entry.error)
            self._evict(name, "runner_exited")
            reaped.append(name)
        return reaped

    def apply(self, specs: tuple[ModelSpec, ...]) -> dict[str, list[str]]:
        """Serve the models `specs` lists from now (the config was reread, after a pull):
        new ones load on demand (or now, with `load = "startup"`); a model taken out of
        the list serves nothing more and is unloaded once idle; a changed one is replaced
        by its new entry once idle."""
        wanted = {spec.name: spec for spec in specs}
        added, removed, changed = [], [], []
        for name, spec in wanted.items():
            entry = self.registry.entries.get(name)
            if entry is None:
                self.registry.add(spec)
                added.append(name)
                if spec.load == "startup":
                    self.ensure_loaded(name)
            elif entry.handler.spec != spec:
                self._retiring[name] = spec
                changed.append(name)
            elif entry.retired:  # listed again before it went
                entry.retired = False
                self._retiring.pop(name, None)
                added.append(name)
        for name, entry in self.registry.entries.items():
            if name not in wanted and not entry.retired:
                entry.retired = True
                self._retiring[name] = None
                removed.append(name)
        self.retire()
        return {"added": added, "removed": removed, "changed": changed}

    def retire(self) -> None:
        """Models out of the config (or changed in it) go once idle (housekeeping)."""
        for name, spec in list(self._retiring.items()):
            entry = self.registry.entries[name]
            if entry.state in ("unloaded", "failed") and name not in self._loading:
                del self._retiring[name]
                if spec is None:
                    self.registry.remove(name)
                else:
                    self.registry.add(spec)
                    log.info("model %s: its new config entry serves from now", name)
            elif entry.state == "ready" and not self._in_flight[name] and name not in self._freeing:
                self._evict(name, "request")

    def reclaim(self) -> list[str]:
        """Unload idle models for a ticket that waits for memory only they hold, or to
        give memory back to other programs (housekeeping; see app.core.lifecycle.eviction). The
        allocator's idle cache goes first (app.core.lifecycle.cache_return)."""
        self._cache.tick()
        waiting = [(t.owner, t.nbytes) for t in self._scheduler.gate.waiting]
        pool = self._memory.pool_bytes()  # the most it was since our last load or unload:
        self._settled_pool = max(self._settled_pool, pool - PRESSURE_MARGIN)
        need = eviction.need(
            waiting,
            pool,
            min(self.headroom, self._settled_pool),
            self._scheduler.running_models(),
            sum(self._freeing.values()),
        )
        if need is None:
            return []
        chosen = eviction.choose(self._residents(), need)
        for resident in chosen:
            self._evict(resident.name, need.reason)
        if need.reason == "pressure" and chosen:
            self.gave_back = GaveBack(
                sum(r.nbytes for r in chosen), tuple(r.name for r in chosen), time.time()
            )
            log.warning(
                "other programs need the memory: giving %.1f MiB back (unloading %s)",
                self.gave_back.nbytes / 2**20,
                ", ".join(self.gave_back.models),
            )
        return [r.name for r in chosen]

    def _residents(self) -> list[eviction.Resident]:
        """Loaded models that could be unloaded, with their bytes and last use."""
        idle_since = self._in_flight.idle_since
        return [
            eviction.Resident(name, entry.loaded_bytes, idle_since.get(name, 0.0))
            for name, entry in self.registry.entries.items()
            if entry.state == "ready" and name not in self._freeing and entry.loaded_bytes
        ]

    def describe(self) -> list[dict[str, Any]]:
        """The registry's models with how long each stays: `keep_alive_s` (None: for
        good) and `unloads_in_s` (None: busy, or not loaded)."""
        now = self._clock()
        rows = self.registry.describe()
        for row in rows:
            name, seconds = row["name"], self.keep_alive.seconds(row["name"])
            left = self.keep_alive.left(name, now) if row["state"] == "ready" else None
            row["keep_alive_s"] = None if math.isinf(seconds) else seconds
            row["unloads_in_s"] = None if left is None or math.isinf(left) else round(left, 1)
        return rows

    def gave_back_view(self) -> dict[str, Any] | None:
        """The last memory given back to other programs (/status `gave_back`)."""
        given = self.gave_back
        if given is None:
            return None
        return {"bytes": given.nbytes, "models": list(given.models), "at": given.at}

    def reclaimable(self) -> int:
        """Bytes that idle models hold: a job may wait for them (the gate's capacity)."""
        busy = self._scheduler.running_models()
        idle = [r for r in self._residents() if not self._in_flight[r.name]]
        return sum(r.nbytes for r in idle if r.name not in busy)

    def _evict(self, name: str, reason: eviction.Reason) -> None:
        """Unload an idle model (nothing of it runs): from this moment no request is
        admitted for it, and those that waited for it wait for its reload instead."""
        entry = self.registry.entries[name]
        entry.state = "unloading"
        self.keep_alive.unloaded(name)
        self._freeing[name] = entry.loaded_bytes
        self._scheduler.fail_waiting(name, ModelEvicted(f"model {name!r} was unloaded"))
        task = asyncio.create_task(self._drop(name, reason), name=f"unload {name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drop(self, name: str, reason: eviction.Reason) -> None:
        try:
            try:
                freed, _ = await self._executor.run_load(self.registry.unload, name)
            except Exception as exc:  # its memory stays out of the pool, which follows it
                entry = self.registry.entries[name]
                entry.state, entry.error = "failed", f"unload failed: {exc}"
                log.error("model %s %s", name, entry.error)
                return
            self._released(freed)
            log.info("model %s unloaded (%s), %.1f MiB freed", name, reason, freed / 2**20)
            self._on_unloaded(name, reason)
        finally:
            self._freeing.pop(name, None)
            self._scheduler.pump()

    def _released(self, freed: int) -> None:
        """Weights were dropped: the pool grows by them, seen at once (a snapshot taken
        before the unload would count them twice)."""
        self._memory.baseline = max(0, self._memory.baseline - freed)
        self._memory.snapshot(fresh=True)
        self._settle()

    def _settle(self) -> None:
        """After a load or an unload: the pool our own models leave jobs, less a margin
        for noise, is the floor below which other programs are taking memory."""
        self._memory.snapshot(fresh=True)
        self._settled_pool = max(0, self._memory.pool_bytes() - PRESSURE_MARGIN)

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
            self._settle()
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
        while self._clock() < deadline and self._state.serving:
            entry = self.registry.entries.get(name)
            if entry is None or entry.retired or entry.state in ("ready", "warming", "failed"):
                return
            self.ensure_loaded(name)
            await asyncio.sleep(LOAD_POLL_S)

    def ensure_loaded(self, name: str) -> None:
        """A request for an unloaded model starts loading it (and waits: `wait_loaded`)."""
        entry = self.registry.entries.get(name)
        unloaded = entry is not None and entry.state == "unloaded" and not entry.retired
        if unloaded and name not in self._loading and name not in self._retiring:
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
        room = self._memory.device_bytes()
        expected = entry.handler.fitted_bytes(self._memory.device, room)
        try:
            if expected > room:
                raise ExceedsDevice(
                    f"its weights take {expected} bytes; this device has {room} for models "
                    "and jobs",
                    details={"needed_bytes": expected, "available_bytes": room},
                )
            permit = await self._scheduler.admit_load(name, min(expected + self.headroom, room))
        except VramgateError as exc:
            entry.state, entry.error = "failed", f"cannot load: {exc.message}"
            log.error("model %s %s", name, entry.error)
            return False
        loaded = False
        try:
            loaded, alone = await self._executor.run_load(self.registry.load, name)
            if loaded and not alone:  # jobs ran meanwhile: our growth is not all weights
                entry.loaded_bytes = entry.weights_bytes
            if loaded:  # out of the pool before the permit goes back, or the next load
                self._memory.baseline += entry.loaded_bytes  # would see them as free
                self._settle()
        finally:
            self._scheduler.release(permit)
        return loaded

    async def load(self, name: str) -> None:
        entry = self.registry.entry(name)
        try:
            if entry.state not in ("unloaded", "failed"):
                return
            if await self._load_admitted(name):
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
        self.keep_alive.unloaded(name)
        deadline = self._clock() + wait_s
        while self._in_flight[name] and self._clock() < deadline:
            await asyncio.sleep(0.02)
        if self._in_flight[name] and not await self._end_work(name):
            entry.state = "ready"
            return 0
        freed, _ = await self._executor.run_load(self.registry.unload, name)
        self._released(freed)
        self._on_unloaded(name, "request")
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
