"""MemoryGate: admits a job when its price in bytes fits in the pool AND a slot is free.

Pure Python: no torch, no FastAPI, no asyncio; the clock and the pool are injected.
The gate is owned by one thread (the server's event loop); it has no lock. It calls
nobody back: every call returns the permits it started, and its owner starts their work
once the call has returned.

Order: first come, first served among jobs that fit. A job at the head of the queue
that does not fit yet may be overtaken by later, smaller jobs that fit now, at most
`max_head_bypass` times; after that nothing passes it, so a large job is never starved
by a stream of small ones. An *exclusive* job (an unseen bucket measured alone) runs
only on an idle device and nothing runs beside it.

Classes (app.sched.priority): the queue is ordered by class, then arrival. Background
work steps aside while work of a higher class runs or waits (`step_aside`), never takes
the pool's last bytes or its model's last cells (a reserve as large as the largest of
the latest interactive requests, or, before one came, as itself), and after `aging_s`
of waiting counts as interactive: its wait is bounded by that and the queue ahead.

Slots: one-shot jobs take one of `slots`; with `stream_slots`, a generation stream takes
one of those instead, so streams that last minutes never leave an embedding waiting for
a slot (bytes are shared by both). A ticket whose kind has no free slot waits for one
without blocking the other kind.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable

from app.sched.plan import GroupPricer, grow_group, plan_admissions
from app.sched.priority import Priority
from app.sched.tickets import Admit, Decision, Permit, Reject, Ticket, Wait

__all__ = ["Admit", "Decision", "MemoryGate", "Permit", "Reject", "Ticket", "Wait"]

TYPICAL = 8  # the latest interactive requests the background reserve is sized from


class MemoryGate:
    """Bytes + slots admission with a bounded FIFO queue and deadlines."""

    def __init__(
        self,
        *,
        pool: Callable[[], int],
        capacity: Callable[[], int],
        slots: int,
        max_queue: int,
        clock: Callable[[], float],
        max_head_bypass: int = 16,
        price_group: GroupPricer | None = None,
        batch_wait_s: float = 0.0,
        stream_slots: int = 0,
        aging_s: float = 60.0,
        step_aside: bool = True,
        single_after_s: float = 0.0,
    ) -> None:
        """`stream_slots` 0: streams take job slots like any job. `aging_s`: how long
        background work waits before it counts as interactive; `step_aside` False:
        background starts beside interactive work (ordered and reserved, no more);
        `single_after_s`: for this long after interactive work ran or waited, background
        work runs one ticket at a time (0: as many as fit)."""
        if slots < 1:
            raise ValueError("a gate needs at least one slot")
        self._pool = pool  # bytes jobs may hold in total right now (follows the device)
        self._capacity = capacity  # the most the pool could ever be on this device
        self._clock = clock
        self.slots = slots
        self.stream_slots = stream_slots
        self.max_queue = max_queue
        self.max_head_bypass = max_head_bypass
        self._price_group = price_group
        # A batchable group short of its limit waits up to this long (from its leader's
        # arrival) for more members; a caller re-plans (pump) when that time is up.
        self.batch_wait_s = batch_wait_s
        self.aging_s = aging_s
        self.step_aside = step_aside
        self.single_after_s = single_after_s
        self._person_at: float | None = None  # when interactive work last ran or waited
        # the latest interactive requests' (bytes, cells, cell pool): the reserve's size
        self._typical: deque[tuple[int, int, str]] = deque(maxlen=TYPICAL)
        self._aside: set[int] = set()
        self._queue: list[Ticket] = []
        self._running: dict[int, Permit] = {}
        self._cells: dict[str, int] = {}  # each cell pool's size (a runner's slots)
        self._ids = itertools.count(1)

    # -- what is held -----------------------------------------------------------------
    @property
    def held_bytes(self) -> int:
        return sum(p.nbytes for p in self._running.values())

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def running_streams(self) -> int:
        return sum(1 for p in self._running.values() if p.stream)

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def waiting(self) -> tuple[Ticket, ...]:
        return tuple(self._queue)

    @property
    def permits(self) -> tuple[Permit, ...]:
        return tuple(self._running.values())

    def set_cells(self, pool: str, size: int | None) -> None:
        """A model's own pool of cells (its runner's slots); None: it has none. Takes
        effect at the next decision; permits already running keep theirs."""
        if size is None:
            self._cells.pop(pool, None)
        else:
            self._cells[pool] = size

    def free_cells(self) -> dict[str, int]:
        """Each cell pool's free cells now."""
        free = dict(self._cells)
        for permit in self._running.values():
            if permit.cells and permit.cell_pool in free:
                free[permit.cell_pool] -= permit.cells
        return free

    def next_id(self) -> int:
        """A fresh ticket id, for callers that must know it before submitting."""
        return next(self._ids)

    def pool_bytes(self) -> int:
        return self._pool()

    def oldest_wait_s(self) -> float:
        if not self._queue:
            return 0.0
        return max(0.0, self._clock() - self._queue[0].enqueued_at)

    def rank(self, ticket: Ticket, now: float) -> int:
        """Its class in the queue now: background that has waited `aging_s` is
        interactive."""
        if ticket.priority >= Priority.BACKGROUND and now - ticket.enqueued_at >= self.aging_s:
            return Priority.INTERACTIVE
        return ticket.priority

    def depth_by_class(self) -> dict[str, int]:
        """Waiting tickets by class (as they were asked, aged or not)."""
        depth = dict.fromkeys((p.label for p in Priority), 0)
        for ticket in self._queue:
            depth[Priority(ticket.priority).label] += 1
        return depth

    def oldest_wait_by_class(self) -> dict[str, float]:
        """Each class's longest wait now (0: none waits)."""
        now = self._clock()
        oldest = dict.fromkeys((p.label for p in Priority), 0.0)
        for ticket in self._queue:
            label = Priority(ticket.priority).label
            oldest[label] = max(oldest[label], now - ticket.enqueued_at)
        return oldest

    def estimated_wait_s(self, position: int | None = None) -> float:
        """Rough wait for a ticket at `position` (default: the tail) from learned run times."""
        ahead = self._queue if position is None else self._queue[:position]
        queued = sum(t.expected_s for t in ahead)
        running = sum(p.expected_s for p in self._running.values()) / 2
        return (queued + running) / self.slots

    # -- decisions --------------------------------------------------------------------
    def submit(
        self, ticket: Ticket, *, ignore_queue_limit: bool = False, check_capacity: bool = True
    ) -> Decision:
        """`check_capacity=False`: the caller has checked that the ticket can ever fit
        (a model load, which memory held by other models may make room for)."""
        now = self._clock()
        ticket.id = ticket.id or self.next_id()
        ticket.enqueued_at = now
        capacity = self._capacity()
        if check_capacity and ticket.nbytes > capacity:
            return Reject("exceeds_device", ticket.nbytes, capacity, self.depth, 0.0)
        self._queue.append(ticket)
        started = tuple(self._admit(now))
        # admitted as a leader, or riding in a group whose leader waited (a pool that
        # grew, or a group that was gathering)
        mine = next((p for p in started if ticket.id in p.ticket_ids), None)
        if mine is not None:
            return Admit(mine, started)
        position = self._queue.index(ticket)
        if position >= self.max_queue and not ignore_queue_limit:
            self._queue.remove(ticket)
            wait = self.estimated_wait_s(position)  # behind what its class lets ahead
            free = self.free_bytes()
            return Reject("queue_full", ticket.nbytes, free, self.depth, wait, started)
        return Wait(position, self.estimated_wait_s(position), started)

    def release(self, permit: Permit) -> list[Permit]:
        """Give a permit back (idempotent) and return the permits this frees for waiters."""
        now = self._clock()
        ended = self._running.pop(permit.ticket_id, None)
        if ended is not None and ended.person:
            self._person_at = now
        return self._admit(now)

    def cancel(self, ticket: Ticket) -> list[Permit]:
        """Remove a waiting ticket (client gone, deadline passed). Idempotent."""
        if ticket in self._queue:
            self._queue.remove(ticket)
        return self._admit(self._clock())

    def expire(self) -> tuple[list[Ticket], list[Permit]]:
        """Drop tickets whose deadline has passed; returns (expired, newly admitted)."""
        now = self._clock()
        expired = [t for t in self._queue if t.deadline <= now]
        self._queue = [t for t in self._queue if t.deadline > now]
        return expired, self._admit(now)

    def pump(self) -> list[Permit]:
        """Re-plan after the pool changed (memory freed by another program)."""
        return self._admit(self._clock())

    def drain_queue(self) -> list[Ticket]:
        """Remove every waiting ticket (shutdown); running permits are untouched."""
        waiting, self._queue = self._queue, []
        return waiting

    def free_bytes(self) -> int:
        return self._pool() - self.held_bytes

    def _admit(self, now: float) -> list[Permit]:
        ranks = {id(t): self.rank(t, now) for t in self._queue}
        self._aside = set()  # background tickets held back this time: no lead, no ride
        self._queue.sort(key=lambda t: (ranks[id(t)], t.enqueued_at, t.id))
        eligible = self._eligible(now) if self.batch_wait_s > 0 else None
        eligible = self._stepping_aside(ranks, eligible, now)
        ends, held, streams, exclusive = [], 0, 0, False  # one pass over what runs
        for p in self._running.values():
            ends.append((p.nbytes, p.admitted_at + p.expected_s))
            held += p.nbytes
            streams += p.stream
            exclusive = exclusive or p.exclusive
        separate = self.stream_slots > 0
        chosen, heads = plan_admissions(
            self._queue if eligible is None else [self._queue[i] for i in eligible],
            free_bytes=self._pool() - held,
            free_slots=self.slots - len(ends) + (streams if separate else 0),
            free_stream_slots=self.stream_slots - streams if separate else None,
            running=ends,
            now=now,
            exclusive_running=exclusive,
            max_head_bypass=self.max_head_bypass,
            free_cells=self.free_cells() if self._cells else None,
            reserve=self._reserve_for(ranks),
        )
        if not chosen:
            return []
        if eligible is not None:
            chosen = [eligible[i] for i in chosen]
            heads = {eligible[i]: pool for i, pool in heads.items()}
        groups = self._groups(chosen)
        positions = {id(t): i for i, t in enumerate(self._queue)}
        picked = {id(t) for members, _, _ in groups for t in members}
        for index, pool in heads.items():  # what started from behind a head overtook it
            self._queue[index].bypassed += sum(
                1
                for members, _, _ in groups
                for t in members
                if positions[id(t)] > index and (pool is None or t.cell_pool == pool)
            )
        self._queue = [t for t in self._queue if id(t) not in picked]
        permits = []
        for members, nbytes, exclusive in groups:
            leader = members[0]
            permit = Permit(
                leader.id,
                nbytes,
                exclusive,
                max(t.expected_s for t in members),
                now,
                now - leader.enqueued_at,
                tuple(t.id for t in members),
                stream=leader.stream,
                cells=sum(t.cells for t in members),
                cell_pool=leader.cell_pool,
                priority=ranks[id(leader)],
                person=leader.priority < Priority.BACKGROUND,
            )
            self._running[leader.id] = permit
            permits.append(permit)
            if permit.priority < Priority.BACKGROUND:
                for t in members:
                    if t.typical:
                        self._typical.append((t.nbytes, t.cells, t.cell_pool))
        return permits

    def _stepping_aside(
        self, ranks: dict[int, int], eligible: list[int] | None, now: float
    ) -> list[int] | None:
        """The queue positions that may start (of `eligible`, None: all): without the
        background tickets while a person's work (its own class above background, not
        aged into it) runs or waits; for `single_after_s` after that, with one
        background ticket at most running. Aged tickets start as interactive ones."""
        if not self.step_aside:
            return eligible
        positions = range(len(self._queue)) if eligible is None else eligible
        person = any(p.person for p in self._running.values()) or any(
            t.priority < Priority.BACKGROUND for t in self._queue
        )
        kept = [i for i in positions if ranks[id(self._queue[i])] < Priority.BACKGROUND]
        if person:
            self._person_at = now
        elif not self._person_near(now):
            return eligible
        elif not any(not p.person for p in self._running.values()):
            background = (i for i in positions if ranks[id(self._queue[i])] >= Priority.BACKGROUND)
            kept += [i for i in itertools.islice(background, 1)]  # in order: the first
        self._aside = {id(t) for t in self._queue if ranks[id(t)] >= Priority.BACKGROUND} - {
            id(self._queue[i]) for i in kept
        }
        return sorted(kept)

    def _person_near(self, now: float) -> bool:
        """Whether a person's work (its own class, not aged into it) ran or waited
        within `single_after_s`."""
        return self._person_at is not None and now - self._person_at < self.single_after_s

    def _reserve_for(self, ranks: dict[int, int]) -> Callable[[Ticket], tuple[int, int]]:
        """What a ticket must leave free beside it: nothing for interactive work; for
        background, the bytes and (in its own cell pool) the cells of the largest of the
        latest interactive requests, or its own where none came yet; none for the first
        one on an idle device (a job as large as the pool would never start otherwise),
        which leaves the reserve to the rest of a flood that starts at once."""
        typical_bytes = max((b for b, _, _ in self._typical), default=None)
        waived = [not self._running]  # one background job may take the whole idle device

        def reserve(ticket: Ticket) -> tuple[int, int]:
            if ranks[id(ticket)] < Priority.BACKGROUND:
                return 0, 0
            if waived[0]:
                waived[0] = False
                return 0, 0
            cells = [c for _, c, pool in self._typical if pool == ticket.cell_pool and c]
            return (
                ticket.nbytes if typical_bytes is None else typical_bytes,
                max(cells) if cells else ticket.cells,
            )

        return reserve

    def _eligible(self, now: float) -> list[int]:
        """With a batch wait: the queue positions that may start a job now. Of each batch
        key only its oldest waiting ticket may lead (the others ride with it), and only
        once its group is full or it has waited `batch_wait_s`."""
        counts: dict[str, int] = {}
        oldest: dict[str, Ticket] = {}
        for ticket in self._queue:
            if ticket.batch_key is not None:
                counts[ticket.batch_key] = counts.get(ticket.batch_key, 0) + 1
                oldest.setdefault(ticket.batch_key, ticket)
        eligible = []
        for index, ticket in enumerate(self._queue):
            key = ticket.batch_key
            if key is not None and (
                oldest[key] is not ticket
                or (
                    counts[key] < ticket.batch_limit
                    and now - ticket.enqueued_at < self.batch_wait_s
                )
            ):
                continue
            eligible.append(index)
        return eligible

    def _groups(self, chosen: list[int]) -> list[tuple[list[Ticket], int, bool]]:
        """Grow each admitted ticket that has a batch key into a group of the waiting
        tickets with the same key that come after it, as far as the free bytes allow."""
        free = self.free_bytes() - sum(self._queue[i].nbytes for i in chosen)
        taken = set(chosen)
        alone = len(chosen) == 1 and self.running == 0
        groups = []
        for index in chosen:
            leader = self._queue[index]
            if leader.batch_key is None or self._price_group is None or leader.batch_limit < 2:
                groups.append(([leader], leader.nbytes, leader.exclusive))
                continue
            riders = [
                t
                for j, t in enumerate(self._queue)
                if j > index
                and j not in taken
                and t.batch_key == leader.batch_key
                and id(t) not in self._aside
            ]
            members, nbytes, exclusive = grow_group(
                leader,
                riders,
                available=free + leader.nbytes,
                alone=alone,
                price_group=self._price_group,
            )
            taken.update(self._queue.index(t) for t in members[1:])
            free -= nbytes - leader.nbytes
            groups.append((members, nbytes, exclusive))
        return groups
