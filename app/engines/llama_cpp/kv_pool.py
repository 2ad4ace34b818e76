"""A runner's KV cells as one pool the gate admits requests from: how many cells, how
many slots, and how many cells one request may hold. Pure: numbers in, a pool out.

llama.cpp runs with one unified KV of `cells` cells (its `n_ctx`) and many slots, each
allowed up to `per_request` cells (`kv_unified_per_slot`). A request is admitted by the
gate for its prompt plus `max_tokens` cells, and at least `cells / slots`, so the
requests it admits never hold more than the pool nor more requests than there are slots:
nothing waits inside llama.cpp and no request overruns another's cells (llama.cpp fails
every running request of a unified KV that overflows). A slot's prompt cache kept from an
ended request takes cells nobody was admitted for; llama.cpp purges an idle slot's cache
when a running request needs its cells ("try_clear_id: purging slot", tried here).

By default a request may use the model's whole trained context, and the pool holds
`POOL_REQUESTS` of them (at most `MAX_CELLS`, which then caps a request too), shrunk to
what the device can give (down to `FLOOR_CELLS`) before any layer is left on the CPU;
`kv_budget` caps its bytes.
A model whose layers attend to a sliding window (Gemma 2 and 3) holds `cells` cells only
in its other layers: llama.cpp gives the sliding ones a cache of their own, sized for a
window of each slot's and a micro-batch (`window_cells`).
`context_length` and `parallel` remain as caps; set both, and the pool is their product
(the old split's size), kept whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_SLOTS = 32  # slots cost no cells of their own: many, so nobody waits for one
POOL_REQUESTS = 4  # a default pool holds this many requests of the whole context
MAX_CELLS = 65_536
FLOOR_CELLS = 4096  # the least a pool shrinks to for the device (or the context, if less)
CELLS_PER_SLOT = 64  # slots beyond one per this many cells would only ever hold a few


@dataclass(frozen=True)
class KvPool:
    cells: int  # the unified KV's cells (llama.cpp's n_ctx)
    per_request: int  # the most one request may hold: its prompt and its answer
    slots: int  # llama.cpp's slots (n_parallel): requests at once, at most

    def cells_for(self, prompt: int, max_tokens: int) -> int:
        """The cells a request is admitted for: its whole bound, and its share of the
        slots (so that at most `slots` requests hold the pool)."""
        return max(prompt + max_tokens, math.ceil(self.cells / self.slots))


def plan_pool(
    trained: int,
    *,
    context: int | None,
    parallel: int | None,
    budget_cells: int | None,
    fits: Callable[[int], bool] = lambda cells: True,
) -> KvPool:
    """The pool for a model trained for `trained` tokens (0: unknown, 4096 then).
    `context` and `parallel` are the spec's caps (None: unset); `budget_cells` the most
    cells `kv_budget` buys; `fits(cells)`: whether a pool of that many cells fits the
    device with every layer there (the pool shrinks to fit, down to its floor)."""
    own = trained or FLOOR_CELLS
    per_request = min(own, context) if context else own
    if context and parallel:
        wanted = per_request * parallel
    elif context:  # asked for: a pool holds at least one such request
        wanted = max(per_request, min(per_request * POOL_REQUESTS, MAX_CELLS))
    else:
        wanted = min(per_request * POOL_REQUESTS, MAX_CELLS)
    if budget_cells is not None:
        wanted = max(min(wanted, budget_cells), 16)
    # both caps set: the pool asked for, as it is (the layers give way, not the cells)
    floor = wanted if context and parallel else min(wanted, per_request, FLOOR_CELLS)
    cells = _largest_fitting(wanted, floor, fits)
    per_request = min(per_request, cells)
    return KvPool(cells, per_request, slots_for(cells, parallel))


def slots_for(cells: int, parallel: int | None) -> int:
    """A pool's slots: `parallel` where the spec sets it, else one per `CELLS_PER_SLOT`
    cells, at most `DEFAULT_SLOTS`."""
    return parallel or max(1, min(DEFAULT_SLOTS, cells // CELLS_PER_SLOT))


def window_cells(cells: int, slots: int, window: int, ubatch: int) -> int:
    """The cells llama.cpp gives a sliding-window layer's cache beside a unified KV of
    `cells` cells and `slots` sequences (src/llama-kv-cache-iswa.cpp, `swa_full` off as
    by default): a window for each sequence and a micro-batch of `ubatch` tokens, at
    most the pool's, padded to 256. A tiny Gemma 3 (window 64) at 32,768 cells and 32
    slots logged "creating SWA KV cache, size = 2560 cells". `cells` where no layer
    slides (`window` 0)."""
    if window <= 0:
        return cells
    return -(-min(cells, window * slots + ubatch) // 256) * 256


def _largest_fitting(wanted: int, floor: int, fits: Callable[[int], bool]) -> int:
    """The most cells in [floor, wanted] that fit (`floor` when none does: the layers
    give way then)."""
    if fits(wanted):
        return wanted
    low, high = floor, wanted  # fits(high) is False; low is the answer if nothing fits
    if not fits(low):
        return floor
    while high - low > 256:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
