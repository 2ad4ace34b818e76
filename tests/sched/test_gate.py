"""MemoryGate and its pure planning function, with a fake clock."""

from __future__ import annotations

import pytest

from app.sched.gate import Admit, MemoryGate, Reject, Ticket, Wait, plan_admissions

MiB = 2**20


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_gate(pool: int = 100, slots: int = 4, max_queue: int = 8, bypass: int = 2):
    clock = FakeClock()
    gate = MemoryGate(
        pool=lambda: pool, capacity=lambda: pool, slots=slots, max_queue=max_queue,
        clock=clock, max_head_bypass=bypass,
    )
    return gate, clock


def t(nbytes: int, *, exclusive: bool = False, deadline: float = 1e9, bypassed: int = 0) -> Ticket:
    return Ticket(nbytes=nbytes, deadline=deadline, exclusive=exclusive, bypassed=bypassed)


# (queue sizes, free bytes, free slots, running, max bypass) -> admitted indices
PLAN_TABLE = [
    pytest.param([10, 20], 100, 4, 0, 2, [0, 1], id="all fit in order"),
    pytest.param([60, 60], 100, 4, 0, 2, [0], id="second waits for bytes"),
    pytest.param([10, 10, 10], 100, 2, 0, 2, [0, 1], id="slots bound the count"),
    pytest.param([90, 10], 50, 4, 1, 2, [1], id="small overtakes a blocked head"),
    pytest.param([90, 10, 10, 10], 50, 4, 1, 2, [1, 2], id="overtaking stops at the bypass cap"),
    pytest.param([], 100, 4, 0, 2, [], id="empty queue"),
    pytest.param([10], 100, 0, 4, 2, [], id="no free slot"),
    pytest.param([10], -5, 4, 1, 2, [], id="pool shrank below what is held"),
]


@pytest.mark.parametrize(("sizes", "free", "slots", "running", "bypass", "expected"), PLAN_TABLE)
def test_plan_admissions_table(sizes, free, slots, running, bypass, expected):
    queue = [t(n) for n in sizes]
    chosen = plan_admissions(
        queue, free_bytes=free, free_slots=slots, running=running,
        exclusive_running=False, max_head_bypass=bypass,
    )
    assert chosen == expected


def test_plan_head_at_bypass_cap_blocks_everyone():
    queue = [t(90, bypassed=2), t(10)]
    assert plan_admissions(
        queue, free_bytes=50, free_slots=4, running=1, exclusive_running=False, max_head_bypass=2
    ) == []


def test_plan_exclusive_runs_only_on_idle_device_and_alone():
    queue = [t(30, exclusive=True), t(10)]
    idle = dict(free_bytes=100, free_slots=4, exclusive_running=False, max_head_bypass=2)
    assert plan_admissions(queue, running=0, **idle) == [0]
    # While something runs, the exclusive head waits and a small job may pass it.
    assert plan_admissions(queue, running=1, **idle) == [1]
    assert plan_admissions([t(10)], running=0, **{**idle, "exclusive_running": True}) == []


def test_plan_exclusive_behind_the_head_is_not_overtaking():
    queue = [t(90), t(10, exclusive=True)]
    assert plan_admissions(
        queue, free_bytes=50, free_slots=4, running=0, exclusive_running=False, max_head_bypass=2
    ) == []


def test_submit_admits_when_bytes_and_slot_free():
    gate, _ = make_gate()
    decision = gate.submit(t(40))
    assert isinstance(decision, Admit)
    assert gate.held_bytes == 40 and gate.running == 1


def test_submit_waits_then_release_admits_fifo():
    gate, _ = make_gate(pool=100)
    first = gate.submit(t(70))
    woken = []
    second, third = t(60), t(50)
    second.on_admit = lambda p: woken.append(("second", p))
    third.on_admit = lambda p: woken.append(("third", p))
    assert isinstance(gate.submit(second), Wait)
    assert isinstance(gate.submit(third), Wait)
    assert isinstance(first, Admit)
    gate.release(first.permit)
    assert [name for name, _ in woken] == ["second"]
    assert gate.held_bytes == 60 and gate.depth == 1


def test_release_is_idempotent():
    gate, _ = make_gate()
    decision = gate.submit(t(40))
    assert isinstance(decision, Admit)
    gate.release(decision.permit)
    gate.release(decision.permit)
    assert gate.held_bytes == 0 and gate.running == 0


def test_never_fits_is_rejected_with_bytes():
    gate, _ = make_gate(pool=100)
    decision = gate.submit(t(150))
    assert isinstance(decision, Reject)
    assert (decision.reason, decision.needed, decision.available) == ("exceeds_device", 150, 100)
    assert gate.depth == 0


def test_queue_full_rejects_and_leaves_no_trace():
    gate, _ = make_gate(pool=100, max_queue=2)
    gate.submit(t(100))
    assert isinstance(gate.submit(t(10)), Wait)  # the head at the bypass cap is not the issue:
    assert isinstance(gate.submit(t(10)), Wait)  # the pool is full
    decision = gate.submit(t(10))
    assert isinstance(decision, Reject) and decision.reason == "queue_full"
    assert decision.queue_depth == 2 and gate.depth == 2


def test_expire_drops_only_overdue_tickets():
    gate, clock = make_gate(pool=100)
    gate.submit(t(100))
    soon, later = t(10, deadline=clock.now + 1), t(10, deadline=clock.now + 5)
    gate.submit(soon)
    gate.submit(later)
    clock.now += 2
    expired, admitted = gate.expire()
    assert expired == [soon] and admitted == []
    assert gate.waiting == (later,)


def test_cancel_frees_the_place_and_may_admit_the_next():
    gate, _ = make_gate(pool=100, bypass=0)
    running = gate.submit(t(50))
    big, small = t(80), t(40)
    gate.submit(big)
    gate.submit(small)
    assert gate.depth == 2  # bypass 0: the small one may not pass the big head
    admitted = gate.cancel(big)
    assert [p.nbytes for p in admitted] == [40]
    assert gate.depth == 0
    assert isinstance(running, Admit)


def test_large_job_is_not_starved_by_a_stream_of_small_ones():
    gate, _ = make_gate(pool=100, slots=8, bypass=3)
    permits = [gate.submit(t(30)).permit for _ in range(2)]  # 60 held
    big = t(90)
    started = []
    big.on_admit = started.append
    gate.submit(big)
    passed = 0
    for _ in range(20):  # a stream of small jobs arrives; each old one finishes
        decision = gate.submit(t(10))
        if isinstance(decision, Admit):
            passed += 1
            permits.append(decision.permit)
        gate.release(permits.pop(0))
        if started:
            break
    assert started, "the large job must start"
    assert passed <= 3


def test_pool_follows_the_device():
    pool = {"bytes": 100}
    gate = MemoryGate(
        pool=lambda: pool["bytes"], capacity=lambda: 100, slots=4, max_queue=8,
        clock=FakeClock(),
    )
    pool["bytes"] = 30  # a game took 70
    assert isinstance(gate.submit(t(50)), Wait)
    pool["bytes"] = 100  # and gave it back
    assert [p.nbytes for p in gate.pump()] == [50]
