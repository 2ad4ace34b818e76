"""MemoryGate, with a fake clock."""

from __future__ import annotations

from app.sched.gate import Admit, MemoryGate, Reject, Ticket, Wait
from app.sched.priority import Priority
from tests.sched.test_plan import cells, stream, t

MiB = 2**20


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_gate(pool: int = 100, slots: int = 4, max_queue: int = 8, bypass: int = 2):
    clock = FakeClock()
    gate = MemoryGate(
        pool=lambda: pool,
        capacity=lambda: pool,
        slots=slots,
        max_queue=max_queue,
        clock=clock,
        max_head_bypass=bypass,
    )
    return gate, clock


def test_submit_admits_when_bytes_and_slot_free():
    gate, _ = make_gate()
    decision = gate.submit(t(40))
    assert isinstance(decision, Admit)
    assert gate.held_bytes == 40 and gate.running == 1


def test_submit_waits_then_release_admits_fifo():
    gate, _ = make_gate(pool=100)
    first = gate.submit(t(70))
    second, third = t(60), t(50)
    assert isinstance(gate.submit(second), Wait)
    assert isinstance(gate.submit(third), Wait)
    assert isinstance(first, Admit)
    woken = gate.release(first.permit)
    assert [p.ticket_id for p in woken] == [second.id]
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
    gate.submit(big)
    passed = 0
    for _ in range(20):  # a stream of small jobs arrives; each old one finishes
        decision = gate.submit(t(10))
        started += [p for p in decision.started if p.ticket_id == big.id]
        if isinstance(decision, Admit):
            passed += 1
            permits.append(decision.permit)
        started += [p for p in gate.release(permits.pop(0)) if p.ticket_id == big.id]
        if started:
            break
    assert started, "the large job must start"
    assert passed <= 3


def test_pool_follows_the_device():
    pool = {"bytes": 100}
    gate = MemoryGate(
        pool=lambda: pool["bytes"],
        capacity=lambda: 100,
        slots=4,
        max_queue=8,
        clock=FakeClock(),
    )
    pool["bytes"] = 30  # a game took 70
    assert isinstance(gate.submit(t(50)), Wait)
    pool["bytes"] = 100  # and gave it back
    assert [p.nbytes for p in gate.pump()] == [50]


def batch_gate(batch_wait_s: float):
    clock = FakeClock()
    gate = MemoryGate(
        pool=lambda: 100,
        capacity=lambda: 100,
        slots=1,
        max_queue=8,
        clock=clock,
        price_group=lambda tickets: (sum(x.nbytes for x in tickets), False),
        batch_wait_s=batch_wait_s,
    )
    return gate, clock


def batchable(nbytes: int = 10, limit: int = 4) -> Ticket:
    return Ticket(nbytes=nbytes, deadline=1e9, batch_key="m", batch_limit=limit)


def test_without_a_batch_wait_a_lone_job_on_an_idle_device_runs_at_once():
    gate, _ = batch_gate(0.0)
    assert isinstance(gate.submit(batchable()), Admit)


def test_with_a_batch_wait_jobs_gather_until_it_is_up():
    gate, clock = batch_gate(0.05)
    tickets = [batchable() for _ in range(3)]
    for ticket in tickets:
        assert isinstance(gate.submit(ticket), Wait)
        clock.now += 0.01
    assert gate.pump() == [] and gate.depth == 3  # 0.03 s after the first: still gathering
    clock.now += 0.03
    [permit] = gate.pump()
    assert permit.members == tuple(x.id for x in tickets) and permit.nbytes == 30
    assert gate.depth == 0


def test_with_a_batch_wait_a_full_group_runs_at_once():
    gate, _ = batch_gate(10.0)
    tickets = [batchable(limit=3) for _ in range(3)]
    assert [type(gate.submit(x)).__name__ for x in tickets] == ["Wait", "Wait", "Admit"]
    [permit] = gate.permits
    assert permit.members == tuple(x.id for x in tickets)


def test_a_batch_wait_does_not_hold_jobs_that_cannot_batch():
    gate, _ = batch_gate(10.0)
    assert isinstance(gate.submit(t(10)), Admit)


def test_a_gathering_group_does_not_hold_up_the_jobs_queued_behind_it():
    gate, _ = batch_gate(10.0)
    assert isinstance(gate.submit(batchable()), Wait)  # gathering for 10 s
    assert isinstance(gate.submit(t(10)), Admit)


def test_a_group_leaves_once_it_has_waited_the_batch_wait_exactly():
    gate, clock = batch_gate(0.5)
    ticket = batchable()
    assert isinstance(gate.submit(ticket), Wait)
    clock.now += 0.25
    assert gate.pump() == []
    clock.now += 0.25  # 1000.5 - 1000.0 is 0.5 exactly in binary
    [permit] = gate.pump()
    assert permit.members == (ticket.id,)


def test_the_oldest_wait_is_the_queue_heads():
    gate, clock = make_gate(pool=100)
    assert gate.oldest_wait_s() == 0.0  # nobody waits
    assert isinstance(gate.submit(t(80)), Admit)
    assert isinstance(gate.submit(t(50)), Wait)
    clock.now += 2.0
    assert isinstance(gate.submit(t(50)), Wait)
    clock.now += 1.0
    assert gate.oldest_wait_s() == 3.0
    gate, clock = make_gate(pool=100)
    gate.submit(t(80))
    gate.submit(t(50))
    clock.now += 0.5
    assert gate.oldest_wait_s() == 0.5  # under a second, as it is


# -- stream slots: streams that last minutes do not take the slots of one-shot jobs ------
def test_four_streams_leave_the_job_slots_to_one_shot_jobs():
    clock = FakeClock()
    gate = MemoryGate(
        pool=lambda: 100, capacity=lambda: 100, slots=4, stream_slots=4, max_queue=8,
        clock=clock,
    )  # fmt: skip
    for _ in range(4):
        assert isinstance(gate.submit(stream(10)), Admit)
    assert isinstance(gate.submit(stream(10)), Wait)  # a fifth stream waits for a slot
    assert isinstance(gate.submit(t(10)), Admit)  # an embedding does not
    assert (gate.running, gate.running_streams) == (5, 4)
    bytes_bound = gate.submit(t(60))  # 50 bytes held, 50 free: bytes still bind
    assert isinstance(bytes_bound, Wait)


def runner_request(model: str, nbytes: int = 0) -> Ticket:
    """A request to a model whose runner has a fixed number of slots (its cells)."""
    return Ticket(nbytes=nbytes, deadline=1e9, stream=True, cells=1, cell_pool=model, owner=model)


def test_a_runners_requests_wait_for_its_own_slots_and_not_inside_it():
    gate, _ = make_gate(pool=100, slots=16)
    gate.set_cells("llama", 2)
    first, second, third = (gate.submit(runner_request("llama")) for _ in range(3))
    assert isinstance(first, Admit) and isinstance(second, Admit)
    assert isinstance(third, Wait)  # both slots are taken: it waits in our queue
    assert gate.free_cells() == {"llama": 0}
    started = gate.release(first.permit)
    assert len(started) == 1 and started[0].cell_pool == "llama"
    assert gate.free_cells() == {"llama": 0}


def test_a_long_request_to_a_runner_is_not_starved_by_short_ones():
    """Short requests to the same model pass a request that waits for its model's cells
    at most max_head_bypass times; then they wait behind it, and it starts once running
    ones end (before, every short one that fitted passed it, for ever)."""
    gate, _ = make_gate(pool=100, slots=16, bypass=2)
    gate.set_cells("llama", 10)
    first = gate.submit(cells(4))
    assert isinstance(first, Admit)
    long = cells(8)
    assert isinstance(gate.submit(long), Wait)  # 6 cells free
    second, third = gate.submit(cells(2)), gate.submit(cells(2))
    assert isinstance(second, Admit) and isinstance(third, Admit)  # two may pass it
    late = cells(2)
    assert isinstance(gate.submit(late), Wait)  # 2 cells free, but the cap is reached
    assert long.bypassed == 2
    assert gate.release(first.permit) == []  # 6 free: still not enough for the long one
    started = gate.release(second.permit)  # 8 free: the long one first
    assert [p.ticket_id for p in started] == [long.id]
    assert [t.id for t in gate.waiting] == [late.id]
    assert isinstance(gate.submit(t(10)), Admit)  # other work never waited on it


def test_a_full_runner_holds_back_only_its_own_requests():
    gate, _ = make_gate(pool=100, slots=16, bypass=0)
    gate.set_cells("llama", 1)
    assert isinstance(gate.submit(runner_request("llama")), Admit)
    assert isinstance(gate.submit(runner_request("llama")), Wait)
    # another model's job behind it is no victim of head-of-line blocking (bypass 0)
    assert isinstance(gate.submit(t(10)), Admit)
    assert isinstance(gate.submit(runner_request("other")), Admit)  # a pool never set


# -- classes (app.sched.priority) ------------------------------------------------------------
def classed(nbytes: int, priority: Priority, *, cell_count: int = 0) -> Ticket:
    ticket = cells(cell_count) if cell_count else t(nbytes)
    ticket.priority = priority
    return ticket


def test_background_queued_before_interactive_work_starts_after_it():
    gate, clock = make_gate(pool=100, slots=1)
    running = gate.submit(t(10))
    assert isinstance(running, Admit)
    early = classed(10, Priority.BACKGROUND)
    assert isinstance(gate.submit(early), Wait)
    clock.now += 1
    late = classed(10, Priority.INTERACTIVE)
    decision = gate.submit(late)
    assert isinstance(decision, Wait) and decision.position == 0  # ahead of the early one
    assert [p.ticket_id for p in gate.release(running.permit)] == [late.id]
    # and a `priority` one goes ahead of interactive work
    first = classed(10, Priority.PRIORITY)
    behind = classed(10, Priority.INTERACTIVE)
    gate.submit(behind)
    assert gate.submit(first).position == 0  # type: ignore[union-attr]


def test_background_steps_aside_while_interactive_work_runs_then_takes_the_gap():
    gate, _ = make_gate(pool=100, slots=4)
    chat = gate.submit(t(10))
    assert isinstance(chat, Admit)
    title = classed(10, Priority.BACKGROUND)
    assert isinstance(gate.submit(title), Wait)  # room and slots, but a person's work runs
    assert [p.ticket_id for p in gate.release(chat.permit)] == [title.id]
    # once it runs, interactive work starts beside it (running work is never stopped)
    assert isinstance(gate.submit(t(10)), Admit)


def test_background_starts_beside_interactive_work_where_it_is_told_it_may():
    gate, _ = make_gate(pool=100, slots=4)
    gate.step_aside = False
    assert isinstance(gate.submit(t(10)), Admit)
    assert isinstance(gate.submit(classed(10, Priority.BACKGROUND)), Admit)


def test_background_runs_one_at_a_time_for_single_after_s_after_a_person_s_work():
    """A CPU's gate (single_after_s 30): after a chat ends, a waiting flood starts one
    request, the next when it ends; past 30 s of no interactive work, all that fit."""
    gate, clock = make_gate(pool=100, slots=8)
    gate.single_after_s = 30
    chat = gate.submit(t(10))
    assert isinstance(chat, Admit)
    flood = [classed(10, Priority.BACKGROUND) for _ in range(3)]
    assert all(isinstance(gate.submit(f), Wait) for f in flood)
    first = gate.release(chat.permit)
    assert [p.ticket_id for p in first] == [flood[0].id]  # one, though room for all
    clock.now += 10
    second = gate.release(first[0])
    assert [p.ticket_id for p in second] == [flood[1].id]
    clock.now += 30  # no person for 40 s: as many as fit
    rest = gate.release(second[0])
    assert [p.ticket_id for p in rest] == [flood[2].id]
    assert isinstance(gate.submit(classed(10, Priority.BACKGROUND)), Admit)
    assert isinstance(gate.submit(classed(10, Priority.BACKGROUND)), Admit)


def test_background_that_aged_is_no_person_and_holds_the_flood_to_one_never():
    """A flood alone on a CPU's gate: what waited aging_s counts as interactive and goes
    first, but it is no person: the rest neither steps aside for it nor is held to one
    at a time after it (a bench run saw a flood alone take 7x its time: once a ticket
    aged, the rest stepped aside, aged in turn, and ran one at a time after)."""
    gate, clock = make_gate(pool=100, slots=1, max_queue=16)
    gate.single_after_s = 30
    first = gate.submit(classed(10, Priority.BACKGROUND))
    assert isinstance(first, Admit)
    waiting = [classed(10, Priority.BACKGROUND) for _ in range(3)]
    for w in waiting:
        gate.submit(w)
    clock.now += gate.aging_s + 1  # all three aged
    gate.slots = 8
    started = gate.release(first.permit)
    assert len(started) == 3, started
    assert not any(p.person for p in started)
    # the rest of the flood starts beside them: no person came, none steps aside
    assert isinstance(gate.submit(classed(10, Priority.BACKGROUND)), Admit)
    assert isinstance(gate.submit(classed(10, Priority.BACKGROUND)), Admit)


def test_background_is_not_held_to_one_where_no_person_came_or_single_after_s_is_0():
    gate, _ = make_gate(pool=100, slots=8)
    gate.single_after_s = 30
    flood = [gate.submit(classed(10, Priority.BACKGROUND)) for _ in range(3)]
    assert all(isinstance(f, Admit) for f in flood)  # no person came yet
    gate, _ = make_gate(pool=100, slots=8)  # a GPU's default: 0
    chat = gate.submit(t(10))
    waiting = [classed(10, Priority.BACKGROUND) for _ in range(3)]
    for w in waiting:
        gate.submit(w)
    assert len(gate.release(chat.permit)) == 3  # type: ignore[union-attr]


def test_background_that_waited_aging_s_counts_as_interactive():
    gate, clock = make_gate(pool=100, slots=1, max_queue=8)
    running = gate.submit(t(10))
    old = classed(10, Priority.BACKGROUND)
    gate.submit(old)
    clock.now += gate.aging_s - 1
    younger = classed(10, Priority.INTERACTIVE)
    gate.submit(younger)
    clock.now += 1  # `old` has waited aging_s: before `younger`, which came later
    assert gate.rank(old, clock.now) == Priority.INTERACTIVE
    assert [p.ticket_id for p in gate.release(running.permit)] == [old.id]  # type: ignore[union-attr]
    assert gate.depth_by_class() == {"priority": 0, "interactive": 1, "background": 0}


def test_background_leaves_a_typical_interactive_request_s_cells_free():
    """A model's pool of 100 cells; interactive requests of 30 cells came before.
    Background streams of 20 cells fill it only to 70: an interactive request that
    arrives then is admitted at once."""
    gate, _ = make_gate(pool=100, slots=16)
    gate.set_cells("llama", 100)
    gate.step_aside = False  # the reserve alone
    chats = [gate.submit(classed(0, Priority.INTERACTIVE, cell_count=30)) for _ in range(2)]
    for chat in chats:
        assert isinstance(chat, Admit)
        gate.release(chat.permit)
    flood = [gate.submit(classed(0, Priority.BACKGROUND, cell_count=20)) for _ in range(5)]
    assert [isinstance(d, Admit) for d in flood] == [True, True, True, False, False]
    assert gate.free_cells()["llama"] == 40
    assert isinstance(gate.submit(classed(0, Priority.INTERACTIVE, cell_count=30)), Admit)


def test_background_alone_on_an_idle_device_may_take_it_all():
    gate, _ = make_gate(pool=100, slots=4)
    assert isinstance(gate.submit(classed(100, Priority.BACKGROUND)), Admit)


def test_an_interactive_batch_takes_its_inputs_first_and_no_background_rider():
    """A document's chunks (background) wait; a query's input (interactive) comes: it
    leads the next forward, and the chunks do not ride in it while it is a person's."""
    gate, clock = batch_gate(0.0)
    running = gate.submit(batchable())  # the device is busy: what comes next waits
    assert isinstance(running, Admit)
    chunks = [batchable() for _ in range(3)]
    for chunk in chunks:
        chunk.priority = Priority.BACKGROUND
        gate.submit(chunk)
        clock.now += 0.01
    query = batchable()
    gate.submit(query)
    [permit] = gate.release(running.permit)
    assert permit.members == (query.id,)
    [permit] = gate.release(permit)  # then the chunks, together
    assert permit.members == tuple(chunk.id for chunk in chunks)


def test_a_model_load_does_not_size_the_background_reserve():
    gate, _ = make_gate(pool=100, slots=4)
    load = t(80)
    load.typical = False  # the scheduler's admit_load: a model's weights, not a request
    gate.release(gate.submit(load).permit)  # type: ignore[union-attr]
    chat = gate.submit(t(10))
    gate.release(chat.permit)  # type: ignore[union-attr]
    gate.step_aside = False
    assert isinstance(gate.submit(t(10)), Admit)  # something runs: the reserve applies
    # 10 running, 10 kept for a typical chat: 80 bytes of background fit, not 81
    assert isinstance(gate.submit(classed(80, Priority.BACKGROUND)), Admit)
    assert isinstance(gate.submit(classed(1, Priority.BACKGROUND)), Wait)


def test_a_flood_let_in_at_once_on_an_idle_device_leaves_the_reserve_but_for_its_first():
    """Background tickets waiting behind a person's request are let in together when it
    ends: only the first may go without the reserve, not the whole flood."""
    gate, _ = make_gate(pool=100, slots=8)
    chat = gate.submit(t(20))
    flood = [classed(20, Priority.BACKGROUND) for _ in range(5)]
    for ticket in flood:
        assert isinstance(gate.submit(ticket), Wait)  # stepping aside
    started = gate.release(chat.permit)  # type: ignore[union-attr]
    # 100 bytes, a chat's 20 kept: four of the flood, not five
    assert [p.ticket_id for p in started] == [ticket.id for ticket in flood[:4]]
    assert gate.free_bytes() == 20
