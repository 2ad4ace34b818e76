"""Hypothesis drives MemoryGate through random submits, releases (double ones included),
cancellations, deadlines and pool changes, checking its invariants after every step."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    rule,
)

from app.sched.gate import Admit, MemoryGate, Permit, Reject, Ticket, Wait

CAPACITY = 100
SLOTS = 3
MAX_QUEUE = 5


class GateMachine(RuleBasedStateMachine):
    max_head_bypass = 3

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.pool = CAPACITY
        self.gate = MemoryGate(
            pool=lambda: self.pool,
            capacity=lambda: CAPACITY,
            slots=SLOTS,
            max_queue=MAX_QUEUE,
            clock=lambda: self.now,
            max_head_bypass=self.max_head_bypass,
        )
        self.running: dict[int, Permit] = {}
        self.admission_order: list[int] = []
        self.submitted: list[int] = []
        self.finished: set[int] = set()

    permits = Bundle("permits")
    tickets = Bundle("tickets")

    def _took(self, started) -> None:
        """What one gate call started: right after it, the held bytes (these included)
        fit in the pool, and no ticket was started twice."""
        for permit in started:
            assert self.gate.held_bytes <= self.pool
            assert permit.ticket_id not in self.running, "admitted twice"
            self.running[permit.ticket_id] = permit
            self.admission_order.append(permit.ticket_id)

    @rule(
        target=tickets,
        nbytes=st.integers(1, 120),
        exclusive=st.booleans(),
        ttl=st.floats(0.5, 20),
    )
    def submit(self, nbytes: int, exclusive: bool, ttl: float):
        ticket = Ticket(nbytes=nbytes, deadline=self.now + ttl, exclusive=exclusive)
        decision = self.gate.submit(ticket)
        self._took(decision.started)
        if isinstance(decision, Reject):
            assert nbytes > CAPACITY or decision.reason == "queue_full"
            return multiple()
        self.submitted.append(ticket.id)
        if isinstance(decision, Admit):
            assert decision.permit.ticket_id in self.running
        else:
            assert isinstance(decision, Wait)
        return ticket

    @rule(ticket=consumes(tickets), double=st.booleans())
    def finish(self, ticket: Ticket, double: bool):
        """Release if running (maybe twice), otherwise cancel (client gone)."""
        permit = self.running.pop(ticket.id, None)
        if permit is not None:
            self._took(self.gate.release(permit))
            if double:  # a double release must change nothing
                assert self.gate.release(permit) == []
        else:
            self._took(self.gate.cancel(ticket))
            assert self.gate.cancel(ticket) == []
        self.finished.add(ticket.id)

    @rule(seconds=st.floats(0.1, 10))
    def time_passes(self, seconds: float):
        self.now += seconds
        expired, started = self.gate.expire()
        self._took(started)
        for ticket in expired:
            assert ticket.deadline <= self.now
            self.finished.add(ticket.id)

    @rule(pool=st.integers(0, CAPACITY))
    def other_program_changes_memory(self, pool: int):
        self.pool = pool
        self._took(self.gate.pump())

    @invariant()
    def accounting_is_exact(self):
        assert {p.ticket_id for p in self.gate.permits} == set(self.running)
        assert self.gate.held_bytes == sum(p.nbytes for p in self.running.values())
        assert self.gate.running <= SLOTS

    @invariant()
    def queue_is_bounded_and_disjoint(self):
        waiting = {t.id for t in self.gate.waiting}
        assert self.gate.depth <= MAX_QUEUE
        assert not waiting & set(self.running)
        assert not waiting & self.finished

    @invariant()
    def exclusive_means_alone(self):
        if any(p.exclusive for p in self.running.values()):
            assert len(self.running) == 1

    @invariant()
    def head_is_served_when_it_fits(self):
        """Work-conserving: a head that fits, with a free slot, is never left waiting."""
        if not self.gate.waiting or self.gate.running >= SLOTS:
            return
        head = self.gate.waiting[0]
        if any(p.exclusive for p in self.running.values()):
            return
        if head.exclusive:
            assert self.gate.running > 0 or head.nbytes > self.pool - self.gate.held_bytes
        else:
            assert head.nbytes > self.pool - self.gate.held_bytes

    @invariant()
    def overtaking_is_bounded(self):
        for ticket in self.gate.waiting:
            assert ticket.bypassed <= self.max_head_bypass

    def teardown(self):
        # Cancelling everything and releasing everything returns every byte and slot.
        for ticket in self.gate.waiting:
            self._took(self.gate.cancel(ticket))
        while self.running:
            _, permit = self.running.popitem()
            self._took(self.gate.release(permit))
            for ticket in self.gate.waiting:
                self._took(self.gate.cancel(ticket))
        while self.gate.permits:  # admissions made by the last releases
            self.gate.release(self.gate.permits[0])
        assert self.gate.held_bytes == 0 and self.gate.running == 0 and self.gate.depth == 0


class StrictFifoMachine(GateMachine):
    """With no overtaking allowed, admission order is exactly submission order."""

    max_head_bypass = 0

    @invariant()
    def admission_order_is_submission_order(self):
        admitted = self.admission_order
        order = [i for i in self.submitted if i in set(admitted)]
        assert admitted == order


TestGate = GateMachine.TestCase
TestGate.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestStrictFifo = StrictFifoMachine.TestCase
TestStrictFifo.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class GroupingMachine(RuleBasedStateMachine):
    """Tickets with batch keys are admitted in groups priced by a callback: every ticket
    is admitted exactly once, a group's bytes fit when admitted, and releasing a group's
    permit returns all of them."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.gate = MemoryGate(
            pool=lambda: CAPACITY,
            capacity=lambda: CAPACITY,
            slots=SLOTS,
            max_queue=MAX_QUEUE,
            clock=lambda: self.now,
            max_head_bypass=3,
            price_group=self.price_group,
        )
        self.admitted: dict[int, int] = {}  # ticket id -> permit (leader) id
        self.permits: dict[int, Permit] = {}

    def price_group(self, tickets):
        # A group costs its members' bytes plus 10% (padding), and cannot pass 90 bytes.
        total = int(sum(t.nbytes for t in tickets) * 1.1)
        return None if total > 90 else (total, False)

    def _took(self, started) -> None:
        for permit in started:
            assert self.gate.held_bytes <= CAPACITY
            for ticket_id in permit.ticket_ids:
                assert ticket_id not in self.admitted, "a ticket was admitted twice"
                self.admitted[ticket_id] = permit.ticket_id
            self.permits[permit.ticket_id] = permit

    @rule(nbytes=st.integers(1, 60), key=st.sampled_from([None, "a", "b"]))
    def submit(self, nbytes: int, key: str | None):
        ticket = Ticket(nbytes=nbytes, deadline=self.now + 100, batch_key=key, batch_limit=4)
        decision = self.gate.submit(ticket)
        self._took(decision.started)
        if isinstance(decision, Admit):  # its own permit is among those it started
            assert ticket.id in decision.permit.ticket_ids
            assert self.admitted[ticket.id] == decision.permit.ticket_id

    @rule(data=st.data())
    def finish_a_group(self, data):
        if not self.permits:
            return
        leader = data.draw(st.sampled_from(sorted(self.permits)))
        self._took(self.gate.release(self.permits.pop(leader)))

    @invariant()
    def groups_are_accounted_as_one(self):
        assert self.gate.held_bytes == sum(p.nbytes for p in self.permits.values())
        for permit in self.permits.values():
            assert len(permit.members) <= 4
            if len(permit.members) > 1:
                assert permit.nbytes <= 90  # what the pricer allowed
        waiting = {t.id for t in self.gate.waiting}
        assert not waiting & set(self.admitted)


TestGrouping = GroupingMachine.TestCase
TestGrouping.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
