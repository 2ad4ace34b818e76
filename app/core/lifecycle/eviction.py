"""Which idle models give their memory up, and when: pure decisions, no state.

Weights are bytes of the same device as the jobs' (the pool is what the weights leave),
so two needs unload idle models, least recently used first:

- `lru`: a waiting ticket (a request, or a model's load) needs more than the pool holds
  even with nothing running, and idle models hold the rest. Models with running work, or
  with tickets waiting ahead of it, are never chosen; requests of a chosen model that
  waited behind it go back to wait for their model's reload. Nothing is unloaded unless
  what is chosen covers the whole shortfall: a partial eviction would not let it in.
- `pressure`: other programs took memory, so that jobs have less than `headroom` left.
  Idle models with nothing running or waiting are unloaded until the headroom is back (or
  none is left); they load again on demand when memory returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Reason = Literal["lru", "pressure", "keep_alive", "request", "runner_exited"]


@dataclass(frozen=True)
class Resident:
    """A loaded model that could be unloaded: its bytes and when it was last used."""

    name: str
    nbytes: int
    last_used: float


@dataclass(frozen=True)
class Need:
    reason: Literal["lru", "pressure"]
    shortfall: int
    pinned: frozenset[str]  # models that must stay


def need(
    waiting: Sequence[tuple[str, int]],
    pool: int,
    headroom: int,
    running: Iterable[str],
    freeing: int = 0,
) -> Need | None:
    """What must be freed now, if anything. `waiting`: (model, bytes) of each waiting
    ticket in queue order; `pool`: what jobs may hold in total now; `running`: models with
    work on the device; `freeing`: bytes of unloads already under way."""
    busy = frozenset(running)
    for index, (owner, nbytes) in enumerate(waiting):
        if nbytes > pool:
            ahead = {model for model, _ in waiting[:index]}
            shortfall = nbytes - pool - freeing
            if shortfall <= 0:
                return None
            return Need("lru", shortfall, busy | ahead | {owner})
    if pool + freeing < headroom:
        return Need("pressure", headroom - pool - freeing, busy | {m for m, _ in waiting})
    return None


def choose(residents: Iterable[Resident], need: Need) -> list[Resident]:
    """The least recently used unpinned residents that free `need.shortfall` (for `lru`,
    all of it or nobody)."""
    chosen: list[Resident] = []
    freed = 0
    for resident in sorted(residents, key=lambda r: r.last_used):
        if freed >= need.shortfall:
            break
        if resident.name in need.pinned:
            continue
        chosen.append(resident)
        freed += resident.nbytes
    if need.reason == "lru" and freed < need.shortfall:
        return []
    return chosen
