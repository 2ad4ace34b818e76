"""Loading and unloading one device's models: the states the registry shows while each
happens, and what a request for a model that is away waits for.

A load is admitted by the gate like a job, for the bytes its weights will take (file
sizes × the dtype's element size) plus the headroom jobs keep, and runs in a thread of
its own as device work: no job that overlaps it counts as a clean sample. Warm-up
(injected: the service sends a few real requests through the normal path) gives the
common buckets learned prices before the first caller arrives. An unload of an idle
model (`evict`) stops admissions for it at once and frees its weights on the loader's
thread; an unload asked for lets running streams finish, past its bound ends them with a
proper error event, fails the model's waiting requests with 503, and frees the weights
only once nothing runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from app.core.lifecycle import eviction
from app.core.lifecycle.keep_alive import InFlight, KeepAlive
from app.core.lifecycle.registry import ModelRegistry
from app.core.memory import MemoryView
from app.core.scheduler import Scheduler
from app.core.state import ServerState
from app.devices.executor import Executor
from app.errors import ExceedsDevice, ModelEvicted, ModelLoading, QueueTimeout, VramgateError
from app.models.base import ModelHandler

log = logging.getLogger("vramgate.lifecycle")

LOAD_POLL_S = 0.02  # how often a request waiting for its model looks again
UNLOAD_AT_STOP_S = 30.0  # the most one model's unload at shutdown may take
WarmUp = Callable[[str, ModelHandler], Awaitable[None]]


class ModelLoads:
    def __init__(
        self,
        registry: ModelRegistry,
        scheduler: Scheduler,
        executor: Executor,
        memory: MemoryView,
        state: ServerState,
        keep_alive: KeepAlive,
        *,
        warm_up: WarmUp,
        in_flight: InFlight,
        run_timeout: float,
        clock: Callable[[], float],
        headroom: int,
        settled: Callable[[], None],
        on_unloaded: Callable[[str, eviction.Reason], None],
    ) -> None:
        """`settled` is told after every load and unload (the memory pressure watch
        takes its floor then); `on_unloaded(model, reason)` counts unloads."""
        self.registry = registry
        self._scheduler = scheduler
        self._executor = executor
        self._memory = memory
        self._state = state
        self._keep_alive = keep_alive
        self._warm_up = warm_up
        self._in_flight = in_flight
        self._run_timeout = run_timeout
        self._clock = clock
        self._headroom = headroom
        self._settled = settled
        self._on_unloaded = on_unloaded
        self.loading: dict[str, asyncio.Task[None]] = {}
        self.freeing: dict[str, int] = {}  # models being unloaded: the bytes they hold
        self.held_back: Callable[[str], bool] = lambda name: False  # not to load now
        self._tasks: set[asyncio.Task[None]] = set()

    # -- at start ----------------------------------------------------------------------
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
            self._settled()
        self._state.phase = "warming"
        for name, entry in self.registry.entries.items():
            if entry.state == "warming":
                await self._warmed(name)
        if self._state.phase == "warming":
            self._state.phase = "ready" if self.registry.all_ready else "degraded"
            pool = self._memory.pool_bytes() / 2**20
            log.info("server %s; pool %.1f MiB", self._state.phase, pool)

    async def _warmed(self, name: str) -> None:
        """Warm a model just loaded; one still loaded after (its warm-up may have given
        it back) is kept alive from now."""
        await self.warm(name)
        if self.registry.entries[name].state in ("warming", "ready"):
            self._keep_alive.loaded(name, self._clock())

    async def warm(self, name: str) -> None:
        entry = self.registry.entries[name]
        try:
            await self._warm_up(name, entry.handler)
        except QueueTimeout as exc:  # no room for it now (another program, running work)
            if entry.state != "warming":
                return
            entry.error = f"its warm-up found no room: {exc.message}"
            log.warning(
                "model %s %s; its weights go back, its next request tries again", name, entry.error
            )
            self.evict(name, "pressure")  # not failed: it loaded, nothing is wrong with it
            return
        except VramgateError as exc:
            if entry.state != "warming":  # unloaded meanwhile: its unload's, not a failure
                log.info("model %s: its warm-up ended by its unload: %s", name, exc.message)
                return
            entry.state, entry.error = "failed", f"warm-up failed: {exc.message}"
            log.error("model %s %s", name, entry.error)
            return
        if entry.state == "warming":  # an unload begun meanwhile goes on
            entry.state = "ready"

    # -- a request for a model that is away ----------------------------------------------
    async def wait_loaded(self, name: str, deadline: float) -> None:
        """Wait until `name` serves (loading it if unloaded, after an unload under way,
        its new config entry if it is being replaced), or has failed, or a load begun
        since found no room, or `deadline` passes; what the registry says then is the
        answer (a load that found no room is not tried again for this request: the
        memory it needs is another program's for now)."""
        first = self.registry.entries.get(name)
        tried = first.loads_tried if first is not None else 0
        while self._clock() < deadline and self._state.serving:
            entry = self.registry.entries.get(name)
            if entry is None or entry.retired:
                return
            if entry.state in ("ready", "warming", "failed") and not self.replacing(name):
                return
            if entry.state == "unloaded" and entry.error and entry.loads_tried > tried:
                return
            self.ensure_loaded(name)
            await asyncio.sleep(LOAD_POLL_S)

    async def wait_warmed(self, name: str, deadline: float) -> None:
        """Wait while `name` warms up (it serves meanwhile), until `deadline`."""
        entry = self.registry.entries.get(name)
        while entry is not None and entry.state == "warming" and self._clock() < deadline:
            await asyncio.sleep(LOAD_POLL_S)

    def ensure_loaded(self, name: str) -> None:
        """A request for an unloaded model starts loading it (and waits: `wait_loaded`)."""
        entry = self.registry.entries.get(name)
        unloaded = entry is not None and entry.state == "unloaded" and not entry.retired
        if unloaded and name not in self.loading and not self.held_back(name):
            self.loading[name] = asyncio.create_task(self.load(name))

    def replacing(self, name: str) -> bool:
        """Whether `name` is loaded but its config entry changed (a reread): a new
        request waits for the new entry, so that the old one, once what it runs and
        queues has ended, goes (app.core.lifecycle.reconcile) and a steady flow of
        requests cannot keep it on its old settings."""
        entry = self.registry.entries.get(name)
        loaded = entry is not None and not entry.retired and entry.state in ("ready", "warming")
        return loaded and self.held_back(name)

    def away(self, name: str) -> bool:
        """Whether a request for `name` must first wait for it: a model being unloaded
        or loaded is waited for, and an unloaded one is loaded, as a request waits for
        memory in the queue."""
        entry = self.registry.entries.get(name)
        return entry is not None and entry.state not in ("ready", "warming")

    # -- loading ------------------------------------------------------------------------
    async def _load_admitted(self, name: str) -> bool:
        """Load one model once the gate admits its expected weight bytes."""
        entry = self.registry.entry(name)
        entry.state, entry.error = "loading", None
        entry.loads_tried += 1
        room = self._memory.device_bytes()
        expected = entry.handler.fitted_bytes(self._memory.device, room)
        try:
            if expected > room:
                raise ExceedsDevice(
                    f"its weights take {expected} bytes; this device has {room} for models "
                    "and jobs",
                    details={"needed_bytes": expected, "available_bytes": room},
                )
            permit = await self._scheduler.admit_load(name, min(expected + self._headroom, room))
        except QueueTimeout as exc:  # no room now (other programs, running work): no failure
            entry.state, entry.error = "unloaded", f"its last load found no room: {exc.message}"
            log.warning("model %s %s; its next request tries again", name, entry.error)
            return False
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
                self._settled()
        finally:
            self._scheduler.release(permit)
        return loaded

    async def load(self, name: str) -> None:
        entry = self.registry.entry(name)
        try:
            if entry.state not in ("unloaded", "failed"):
                return
            if await self._load_admitted(name):
                await self._warmed(name)
        finally:
            self.loading.pop(name, None)

    # -- unloading ----------------------------------------------------------------------
    def evict(self, name: str, reason: eviction.Reason) -> asyncio.Task[None]:
        """Unload an idle model (nothing of it runs): from this moment no request is
        admitted for it, and those that waited for it wait for its reload instead. The
        task that drops its weights is returned (to wait for, where a caller must)."""
        entry = self.registry.entries[name]
        entry.state = "unloading"
        self._keep_alive.unloaded(name)
        self.freeing[name] = entry.loaded_bytes
        self._scheduler.fail_waiting(name, ModelEvicted(f"model {name!r} was unloaded"))
        task = asyncio.create_task(self._drop(name, reason), name=f"unload {name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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
            self.freeing.pop(name, None)
            self._scheduler.pump()

    def _released(self, freed: int) -> None:
        """Weights were dropped: the pool grows by them, seen at once (a snapshot taken
        before the unload would count them twice)."""
        self._memory.baseline = max(0, self._memory.baseline - freed)
        self._memory.snapshot(fresh=True)
        self._settled()

    async def unload(self, name: str, wait_s: float = 30.0) -> int:
        """Stop admitting the model's jobs, let running ones finish for `wait_s`, then end
        the rest properly (streams get an error event, waiting requests 503) and drop the
        weights once nothing of the model runs."""
        entry = self.registry.entry(name)
        if entry.state not in ("ready", "warming"):
            return 0
        entry.state = "unloading"
        self._keep_alive.unloaded(name)
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
        for task in [*self.loading.values(), *self._tasks]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._unload_all()

    async def _unload_all(self) -> None:
        """At shutdown (the work ended or cut short before): every loaded model's weights
        dropped, its batch thread and its runner process ended, one after another. Left
        to the process's exit instead, a server that runs inside another program (a test,
        a Ray replica) kept its models, their threads and their runners until that
        program ended; a runner saw its parent gone only then."""
        for name, entry in self.registry.entries.items():
            if entry.state not in ("ready", "warming") or self._scheduler.running_for(name):
                continue  # a run that never came back may still use its weights
            try:
                unloading = self._executor.run_load(self.registry.unload, name)
                await asyncio.wait_for(unloading, UNLOAD_AT_STOP_S)
            except Exception as exc:  # the process ends soon anyway: say so, go on
                log.warning("model %s not unloaded at shutdown: %r", name, exc)
