"""Memory pressure: idle models give their memory up for a ticket that waits for memory
only they hold, or back to other programs (a game starting) when the pool falls below
what our own models left it (app.core.lifecycle.eviction decides which). The
allocator's idle cache goes first (app.core.lifecycle.cache_return)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.core.lifecycle import eviction
from app.core.lifecycle.cache_return import CacheReturn
from app.core.lifecycle.keep_alive import InFlight
from app.core.lifecycle.loads import ModelLoads
from app.core.memory import MemoryView
from app.core.scheduler import Scheduler
from app.devices.executor import Executor

log = logging.getLogger("vramgate.lifecycle")

PRESSURE_MARGIN = 64 * 2**20  # the pool moving this little is noise, not another program


@dataclass(frozen=True)
class GaveBack:
    """Memory given back to other programs: how much, by unloading which, when (epoch)."""

    nbytes: int
    models: tuple[str, ...]
    at: float


class Pressure:
    def __init__(
        self,
        loads: ModelLoads,
        scheduler: Scheduler,
        executor: Executor,
        memory: MemoryView,
        in_flight: InFlight,
        clock: Callable[[], float],
        headroom: int,
    ) -> None:
        """`headroom`: the bytes jobs keep beside the weights (idle models give memory
        back to other programs to keep them)."""
        self._loads = loads
        self.registry = loads.registry
        self._scheduler = scheduler
        self._memory = memory
        self._in_flight = in_flight
        self.headroom = headroom
        self.gave_back: GaveBack | None = None  # the last memory given to other programs
        # The most our own models have left jobs since our last load or unload (less a
        # margin): a pool below the headroom by our own doing is no other program's; a
        # pool that falls below this is
        self._settled_pool = headroom
        self._cache = CacheReturn(memory, executor, clock)

    def settle(self) -> None:
        """After a load or an unload: the pool our own models leave jobs, less a margin
        for noise, is the floor below which other programs are taking memory."""
        self._memory.snapshot(fresh=True)
        self._settled_pool = max(0, self._memory.pool_bytes() - PRESSURE_MARGIN)

    def reclaim(self) -> list[str]:
        """Unload idle models where memory is needed (housekeeping); their names."""
        self._cache.tick()
        waiting = [(t.owner, t.nbytes) for t in self._scheduler.gate.waiting]
        pool = self._memory.pool_bytes()  # the most it was since our last load or unload:
        self._settled_pool = max(self._settled_pool, pool - PRESSURE_MARGIN)
        need = eviction.need(
            waiting,
            pool,
            min(self.headroom, self._settled_pool),
            self._scheduler.running_models(),
            sum(self._loads.freeing.values()),
        )
        if need is None:
            return []
        chosen = eviction.choose(self._residents(), need)
        for resident in chosen:
            self._loads.evict(resident.name, need.reason)
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
        freeing = self._loads.freeing
        return [
            eviction.Resident(name, entry.loaded_bytes, idle_since.get(name, 0.0))
            for name, entry in self.registry.entries.items()
            if entry.state == "ready" and name not in freeing and entry.loaded_bytes
        ]

    def reclaimable(self) -> int:
        """Bytes that idle models hold: a job may wait for them (the gate's capacity)."""
        busy = self._scheduler.running_models()
        idle = [r for r in self._residents() if not self._in_flight[r.name]]
        return sum(r.nbytes for r in idle if r.name not in busy)

    def gave_back_view(self) -> dict[str, Any] | None:
        """The last memory given back to other programs (/status `gave_back`)."""
        given = self.gave_back
        if given is None:
            return None
        return {"bytes": given.nbytes, "models": list(given.models), "at": given.at}
