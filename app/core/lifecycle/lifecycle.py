"""A device's models through their lives: loaded at start or on demand, warmed up,
unloaded, loaded again on demand. `ModelLifecycle` is the one face the service holds;
each job is a part of its own: loading and unloading (app.core.lifecycle.loads), the
config read again (app.core.lifecycle.reconcile), memory given up for waiting work or
other programs (app.core.lifecycle.pressure); the keep-alive view and the
housekeeping that ends idle models and dead runners are here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from functools import partial
from typing import Any

from app.core.lifecycle import eviction
from app.core.lifecycle.keep_alive import InFlight, KeepAlive
from app.core.lifecycle.loads import ModelLoads, WarmUp
from app.core.lifecycle.pressure import Pressure
from app.core.lifecycle.reconcile import Reconcile
from app.core.lifecycle.registry import ModelRegistry
from app.core.memory import MemoryView
from app.core.scheduler import Scheduler
from app.core.state import ServerState
from app.devices.executor import Executor

log = logging.getLogger("vramgate.lifecycle")


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
        self._clock = clock
        self.keep_alive = KeepAlive(partial(self._own_keep_alive, keep_alive_s), in_flight)
        self._loads = ModelLoads(
            registry,
            scheduler,
            executor,
            memory,
            state,
            self.keep_alive,
            warm_up=warm_up,
            in_flight=in_flight,
            run_timeout=run_timeout,
            clock=clock,
            headroom=headroom,
            settled=lambda: self._pressure.settle(),
            on_unloaded=on_unloaded,
        )
        self._pressure = Pressure(
            self._loads, scheduler, executor, memory, in_flight, clock, headroom
        )
        self._reconcile = Reconcile(self._loads, in_flight)
        self._loads.held_back = self._reconcile.retiring.__contains__  # replaced once idle
        # what the service and the fleet ask of it, each of its part
        self.start = self._loads.start
        self.stop = self._loads.stop
        self.load = self._loads.load
        self.unload = self._loads.unload
        self.warm = self._loads.warm
        self.wait_loaded = self._loads.wait_loaded
        self.wait_warmed = self._loads.wait_warmed
        self.ensure_loaded = self._loads.ensure_loaded
        self.away = self._loads.away
        self.replacing = self._loads.replacing
        self.apply = self._reconcile.apply
        self.retire = self._reconcile.retire
        self.reclaim = self._pressure.reclaim
        self.reclaimable = self._pressure.reclaimable
        self.gave_back_view = self._pressure.gave_back_view

    @property
    def headroom(self) -> int:
        return self._pressure.headroom

    def _own_keep_alive(self, default_s: float, name: str) -> float:
        entry = self.registry.entries.get(name)
        own = entry.handler.spec.keep_alive if entry is not None else None
        return default_s if own is None else own

    # -- housekeeping ------------------------------------------------------------------
    def unload_idle(self) -> list[str]:
        """Unload every loaded model idle past its keep-alive, and forget the kept
        prefixes unused for as long."""
        now = self._clock()
        ready = [n for n, e in self.registry.entries.items() if e.state == "ready"]
        for name in ready:
            seconds = self.keep_alive.seconds(name)
            if not math.isinf(seconds):
                self.registry.store.expire(name, seconds)
        freeing = self._loads.freeing
        expired = [n for n in self.keep_alive.expired(ready, now) if n not in freeing]
        for name in expired:
            self._loads.evict(name, "keep_alive")
        return expired

    async def expire(self, name: str) -> None:
        """Ollama's unload (`keep_alive: 0` and nothing to answer): a loaded model goes
        once its running requests end, at once if it is idle (and this waits for its
        weights to go); a model that is not loaded is left as it is."""
        entry = self.registry.entries.get(name)
        if entry is None or entry.state not in ("loading", "warming", "ready"):
            return
        now = self._clock()
        self.keep_alive.request(name, 0.0, now)
        if entry.state != "ready" or name in self._loads.freeing:
            return  # it goes when it is idle and ready (unload_idle)
        if name in self.keep_alive.expired([name], now):
            await self._loads.evict(name, "keep_alive")

    def reap(self) -> list[str]:
        """Models whose runner process ended by itself: once their last request has
        failed, they are unloaded, and the next request loads them again; /status says
        why meanwhile. No respawn loop: crash-only."""
        reaped = []
        for name, entry in self.registry.entries.items():
            if entry.state != "ready" or name in self._loads.freeing:
                continue
            code = entry.handler.exited()
            if code is None or self._scheduler.running_for(name):
                continue
            why = entry.handler.ended_because()
            ended = f"was ended ({why})" if why else f"exited with code {code}"
            entry.error = f"its runner {ended}; it loads again on demand"
            log.error("model %s: %s", name, entry.error)
            self._loads.evict(name, "runner_exited")
            reaped.append(name)
        return reaped

    # -- the keep-alive view -----------------------------------------------------------
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
