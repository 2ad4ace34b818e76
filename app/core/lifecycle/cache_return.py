"""Our allocator's cache given back to the driver.

torch keeps the memory of freed tensors cached for the next job (reserved, not
allocated). The pool rightly counts it as ours to use, so no pressure check ever sees
another program wanting it: after a burst, a game started later got that much less
memory until the models were unloaded (never, with keep_alive = -1). The cache goes back
(`empty_cache`) once the device has been idle for `IDLE_S`, and at once when the driver
has less free than the reserve we leave other programs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from app.core.memory import MemoryView
from app.devices.executor import Executor

log = logging.getLogger("vramgate.memory")

IDLE_S = 5.0  # a burst's next request usually comes sooner: it reuses the cache
# What empty_cache cannot give back (free room inside segments that hold live tensors)
# stays cached; only this much more than that is worth a device-wide synchronise.
MARGIN = 64 * 2**20

Why = Literal["idle", "pressure"]


def give_back(cached: int, idle_s: float, free: int, reserve: int) -> Why | None:
    """Whether the allocator's cache goes back now. `cached`: what it holds beyond what
    the last give-back left; `idle_s`: how long no work ran on the device; `free`: what
    the driver has free for any program; `reserve`: what we leave other programs."""
    if cached < MARGIN:
        return None
    if free < reserve:
        return "pressure"
    return "idle" if idle_s >= IDLE_S else None


class CacheReturn:
    """Gives the cache back when `give_back` says so (a housekeeping step)."""

    def __init__(self, memory: MemoryView, executor: Executor, clock: Callable[[], float]) -> None:
        self._memory = memory
        self._executor = executor
        self._clock = clock
        self._starts = -1  # the executor's count of work when last seen
        self._idle_since = clock()
        self._floor = 0  # what the last give-back left cached

    def tick(self) -> Why | None:
        now = self._clock()
        starts = self._executor.starts
        if self._executor.active or starts != self._starts:
            self._starts, self._idle_since = starts, now
        cached = self._memory.device.cached()
        self._floor = min(self._floor, cached)
        why = give_back(
            cached - self._floor, now - self._idle_since, self._memory.snapshot().free,
            self._memory.reserve,
        )  # fmt: skip
        if why is None:
            return None
        self._executor.empty_cache()
        self._floor = self._memory.device.cached()
        self._memory.snapshot(fresh=True)  # the driver's free memory has grown by it
        log.info("gave %.1f MiB of cache back (%s)", (cached - self._floor) / 2**20, why)
        return why
