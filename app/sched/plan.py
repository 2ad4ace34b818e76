"""Admission planning: which waiting tickets start now, and how far a group grows.

Pure functions over tickets and numbers, tested with tables; the gate calls them with
its queue and what runs.

Tickets start in order while they fit. The first that does not (the head) gets a
reservation: the time enough running jobs are expected to have ended for it to fit. A
later ticket may overtake it only if it fits now and either ends before that time or fits
in what will be spare when the head starts (EASY backfilling), and only while the head
has been overtaken fewer than `max_head_bypass` times, a bound that holds even when
run-time estimates are wrong.

With `free_stream_slots` (not None), stream tickets count against those instead of
`free_slots`; a ticket whose kind has no free slot is passed over, and is no head.

Cells (`free_cells`, by pool: a runner's KV cells) are a model's own limit and hold back
that model's requests only. The first ticket of a pool that does not fit the pool's free
cells is that pool's *cell head*: later tickets of the same pool may overtake it while
they fit, at most `max_head_bypass` times (counting its earlier overtakes), so a request
for a model's whole context is not starved by a stream of short ones to the same model.
Other models' tickets pass it freely: it holds none of their cells.

A ticket's `reserve` (bytes, cells) is what it must leave free beside it (background
work leaves room for an interactive request); one that fits only into the reserve is
passed over, and is no head.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from app.sched.tickets import Ticket

# Prices a would-be group of tickets: (bytes, exclusive), or None if they cannot be merged.
GroupPricer = Callable[[Sequence[Ticket]], tuple[int, bool] | None]
# What a ticket must leave free beside it: (bytes, cells of its own pool).
Reserve = Callable[[Ticket], tuple[int, int]]


def _no_reserve(ticket: Ticket) -> tuple[int, int]:
    return 0, 0


class Planned(NamedTuple):
    """A plan: the queue indices that start now, in order, and the blocked heads (index:
    the cell pool it waits for, or None for the head waiting for bytes). Whatever starts
    from behind a head overtakes it (for a cell head: what starts of its own pool)."""

    start: list[int]
    heads: dict[int, str | None]


def plan_admissions(
    queue: Sequence[Ticket],
    *,
    free_bytes: int,
    free_slots: int,
    running: Sequence[tuple[int, float]],
    now: float,
    exclusive_running: bool,
    max_head_bypass: int,
    free_stream_slots: int | None = None,
    free_cells: Mapping[str, int] | None = None,
    reserve: Reserve = _no_reserve,
) -> Planned:
    """Which queued tickets (indices, in order) start now, and who they overtook (see the
    module's words). `running` holds (bytes, expected end) of the jobs on the device."""
    separate = free_stream_slots is not None
    # free slots by kind: [jobs, streams]; a stream is kind 1 only where streams have
    # slots of their own
    free = [free_slots, free_stream_slots or 0]
    if exclusive_running or (free[0] <= 0 and free[1] <= 0):
        return Planned([], {})
    ends = list(running)
    chosen: list[int] = []
    head: Ticket | None = None
    head_index, shadow, spare, overtakes = -1, 0.0, 0, 0
    cells = dict(free_cells or {})
    cell_heads: dict[str, tuple[int, Ticket]] = {}  # pool: its first cell-blocked ticket
    cell_overtakes: dict[str, int] = {}
    for index, ticket in enumerate(queue):
        kind = 1 if separate and ticket.stream else 0
        if free[kind] <= 0:
            if free[1 - kind] <= 0:
                break
            continue
        pool = ticket.cell_pool if ticket.cells and ticket.cell_pool in cells else None
        free_cells_now = cells[pool] if pool is not None else None
        if _takes_the_reserve(ticket, reserve(ticket), free_bytes, free_cells_now):
            continue  # it would take the room kept for others: passed over, no head
        if pool is not None:
            if cells[pool] < ticket.cells:
                cell_heads.setdefault(pool, (index, ticket))
                continue  # its model is full: it waits for its model, no head of the others
            if pool in cell_heads:
                overtaken = cell_heads[pool][1].bypassed + cell_overtakes.get(pool, 0)
                if overtaken >= max_head_bypass:
                    continue  # its model's cell head has been passed enough
        fits = ticket.nbytes <= free_bytes
        if head is None:
            if ticket.exclusive:
                fits = fits and not ends
            if not fits:
                head, head_index = ticket, index
                shadow, spare = _reservation(ticket, free_bytes, ends)
            else:
                ends.append((ticket.nbytes, now + ticket.expected_s))
        elif head.bypassed + overtakes >= max_head_bypass:
            break
        elif fits and not ticket.exclusive:
            ends_in_time = now + ticket.expected_s <= shadow
            fits = ends_in_time or ticket.nbytes <= spare
            spare -= 0 if ends_in_time or not fits else ticket.nbytes
            overtakes += fits
        else:
            fits = False
        if fits:
            chosen.append(index)
            free_bytes -= ticket.nbytes
            free[kind] -= 1
            if pool is not None:
                cells[pool] -= ticket.cells
                if pool in cell_heads:
                    cell_overtakes[pool] = cell_overtakes.get(pool, 0) + 1
            if head is None and ticket.exclusive:
                break
        if head is not None and head.bypassed + overtakes >= max_head_bypass:
            break
    heads: dict[int, str | None] = {index: pool for pool, (index, _) in cell_heads.items()}
    if head is not None:
        heads[head_index] = None
    return Planned(chosen, heads)


def _takes_the_reserve(
    ticket: Ticket, kept: tuple[int, int], free_bytes: int, free_cells: int | None
) -> bool:
    """Whether `ticket` fits only into what must stay free beside it (`kept`: bytes, and
    cells of its pool, whose free cells are `free_cells`; None: it takes none)."""
    kept_bytes, kept_cells = kept
    if not (kept_bytes or kept_cells):
        return False
    if ticket.nbytes + kept_bytes > free_bytes:
        return True
    return free_cells is not None and ticket.cells + kept_cells > free_cells


def grow_group(
    leader: Ticket,
    riders: Sequence[Ticket],
    *,
    available: int,
    alone: bool,
    price_group: GroupPricer,
) -> tuple[list[Ticket], int, bool]:
    """The largest group of `leader` plus a prefix of `riders` (same batch key, in queue
    order) whose price fits in `available` bytes; exclusive only if it would run `alone`.
    Tries the largest group first, then halves. Pure."""
    count = min(len(riders), max(0, leader.batch_limit - 1))
    while count > 0:
        members = [leader, *riders[:count]]
        priced = price_group(members)
        if priced is not None:
            nbytes, exclusive = priced
            if nbytes <= available and (alone or not exclusive):
                return members, nbytes, exclusive
        count //= 2
    return [leader], leader.nbytes, leader.exclusive


def _reservation(head: Ticket, free_bytes: int, ends: list[tuple[int, float]]) -> tuple[float, int]:
    """When the blocked `head` is expected to fit, and the bytes spare beside it then."""
    available, shadow = free_bytes, float("inf")
    for nbytes, end in sorted(ends, key=lambda e: e[1]):
        if available >= head.nbytes and not head.exclusive:
            break
        available += nbytes
        shadow = end
    if available < head.nbytes:
        return float("inf"), 0  # only memory other programs hold can let it in
    return shadow, 0 if head.exclusive else available - head.nbytes
