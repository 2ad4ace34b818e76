"""The pure planning functions: who starts now, with tables."""

from __future__ import annotations

import pytest

from app.sched.plan import plan_admissions
from app.sched.tickets import Ticket


def t(
    nbytes: int,
    *,
    exclusive: bool = False,
    deadline: float = 1e9,
    bypassed: int = 0,
    expected_s: float = 1.0,
) -> Ticket:
    return Ticket(
        nbytes=nbytes,
        deadline=deadline,
        exclusive=exclusive,
        bypassed=bypassed,
        expected_s=expected_s,
    )


def stream(nbytes: int) -> Ticket:
    return Ticket(nbytes=nbytes, deadline=1e9, expected_s=1.0, stream=True)


def cells(n: int, pool: str = "llama", bypassed: int = 0) -> Ticket:
    """A request for `n` of a runner's KV cells (its model's pool)."""
    return Ticket(nbytes=0, deadline=1e9, stream=True, cells=n, cell_pool=pool, bypassed=bypassed)


def plan(queue, *, free, slots=4, running=(), bypass=2, exclusive_running=False, free_cells=None):
    """`running`: (bytes, expected end) of jobs on the device; now is 0."""
    return plan_admissions(
        queue,
        free_bytes=free,
        free_slots=slots,
        running=list(running),
        now=0.0,
        exclusive_running=exclusive_running,
        max_head_bypass=bypass,
        free_cells=free_cells,
    ).start


# (queue as (bytes, expected seconds), free bytes, free slots, running, bypass) -> indices
LONG = [(50, 10.0)]  # one job holding 50 bytes that is expected to end at t=10
PLAN_TABLE = [
    pytest.param([(10, 1), (20, 1)], 100, 4, [], 2, [0, 1], id="all fit in order"),
    pytest.param([(60, 1), (60, 1)], 100, 4, [], 2, [0], id="second waits for bytes"),
    pytest.param([(10, 1)] * 3, 100, 2, [], 2, [0, 1], id="slots bound the count"),
    pytest.param(
        [(90, 1), (10, 1)], 50, 4, LONG, 2, [1], id="a short job overtakes a blocked head"
    ),
    pytest.param(
        [(90, 1), (20, 20)],
        50,
        4,
        LONG,
        2,
        [],
        id="a job that would delay the head may not overtake",
    ),
    pytest.param(
        [(60, 1), (10, 20)],
        50,
        4,
        LONG,
        2,
        [1],
        id="a long job may overtake into bytes spare beside the head",
    ),
    pytest.param(
        [(90, 1), (10, 1), (10, 1), (10, 1)],
        50,
        4,
        LONG,
        2,
        [1, 2],
        id="overtaking stops at the bypass cap",
    ),
    pytest.param([], 100, 4, [], 2, [], id="empty queue"),
    pytest.param([(10, 1)], 100, 0, LONG, 2, [], id="no free slot"),
    pytest.param([(10, 1)], -5, 4, LONG, 2, [], id="pool shrank below what is held"),
]


@pytest.mark.parametrize(("queue", "free", "slots", "running", "bypass", "expected"), PLAN_TABLE)
def test_plan_admissions_table(queue, free, slots, running, bypass, expected):
    tickets = [t(n, expected_s=s) for n, s in queue]
    assert plan(tickets, free=free, slots=slots, running=running, bypass=bypass) == expected


def test_plan_head_at_bypass_cap_blocks_everyone():
    assert plan([t(90, bypassed=2), t(10)], free=50, running=LONG) == []


@pytest.mark.parametrize(
    ("queue", "free_cells", "cap", "expected", "heads"),
    [
        # the long request waits for its model's cells; two short ones may pass it...
        ([cells(8), cells(2), cells(2), cells(2)], {"llama": 6}, 2, [1, 2], {0: "llama"}),
        # ...fewer where it was passed before (2 + 1 reach the cap of 3)
        ([cells(8, bypassed=2), cells(2), cells(2)], {"llama": 6}, 3, [1], {0: "llama"}),
        # at the cap, none of its own model passes it
        ([cells(8, bypassed=3), cells(2)], {"llama": 6}, 3, [], {0: "llama"}),
        # another model's requests hold none of its cells: they pass it freely
        (
            [cells(8, bypassed=3), cells(2, "other"), t(10)],
            {"llama": 6, "other": 4},
            3,
            [1, 2],
            {0: "llama"},
        ),
        # nothing blocked: no head
        ([cells(2), cells(2)], {"llama": 6}, 2, [0, 1], {}),
    ],
)
def test_a_cell_head_is_overtaken_by_its_own_model_at_most_the_bypass_cap(
    queue, free_cells, cap, expected, heads
):
    planned = plan_admissions(
        queue,
        free_bytes=100,
        free_slots=8,
        running=[],
        now=0.0,
        exclusive_running=False,
        max_head_bypass=cap,
        free_cells=free_cells,
    )
    assert planned.start == expected
    assert planned.heads == heads


def test_plan_exclusive_runs_only_on_idle_device_and_alone():
    queue = [t(30, exclusive=True), t(10)]
    assert plan(queue, free=100) == [0]
    # While something runs, the exclusive head waits; a job ending before it may pass.
    assert plan(queue, free=100, running=[(20, 5.0)]) == [1]
    assert plan([t(10)], free=100, exclusive_running=True) == []


def test_plan_exclusive_behind_the_head_is_not_overtaking():
    assert plan([t(90), t(10, exclusive=True)], free=50) == []


# two jobs running, listed out of the order they end in: 50 bytes back at t=10, 30 at t=20
TWO = [(30, 20.0), (50, 10.0)]


@pytest.mark.parametrize(
    ("head", "behind", "admitted"),
    [
        # 20 free + 50 at t=10 = 70: the head of 60 fits then, 10 spare beside it; a job
        # of 15 ending at t=15 would delay it (by the end at t=20 it would not)
        (60, (15, 15.0), []),
        (60, (10, 15.0), [1]),  # it fits in the spare bytes
        (60, (15, 5.0), [1]),  # it ends before the head's bytes come back
        # the head of 50 fits at t=10 with 20 spare (taking the ends by size, it would fit
        # at t=20 with none): a job of 15 ending at t=25 fits in the spare
        (50, (15, 25.0), [1]),
        # exactly 70 at t=10: the head of 70 fits then, nothing spare
        (70, (15, 15.0), []),
        # exactly 100 once both end: the head fits at t=20, nothing spare
        (100, (15, 25.0), []),
        (100, (15, 15.0), [1]),
        # more than will ever be free: only memory other programs hold can let it in
        (101, (15, 1000.0), [1]),
    ],
)
def test_a_blocked_head_reserves_the_first_moment_it_fits(head, behind, admitted):
    """The head's reservation: the earliest end of the running jobs by which enough
    bytes are back for it, and the bytes spare beside it then. A job behind it starts
    now only if it ends by then or fits in the spare."""
    nbytes, expected_s = behind
    queue = [t(head), t(nbytes, expected_s=expected_s)]
    assert plan(queue, free=20, running=TWO) == admitted


def test_an_exclusive_head_reserves_all_the_bytes_once_everything_has_ended():
    """Nothing runs beside an exclusive head: it fits once every running job has ended
    (t=20), with nothing spare, however few bytes it needs."""
    queue = [t(10, exclusive=True), t(1, expected_s=25.0)]
    assert plan(queue, free=100, running=TWO) == []
    queue = [t(10, exclusive=True), t(1, expected_s=15.0)]
    assert plan(queue, free=100, running=TWO) == [1]


@pytest.mark.parametrize(
    ("queue", "free_slots", "free_streams", "admitted"),
    [
        # no job slot free: the stream behind the waiting job starts
        ([t(10), stream(10)], 0, 1, [1]),
        # no stream slot free: the job behind the waiting stream starts, the stream waits
        ([stream(10), t(10)], 1, 0, [1]),
        # both kinds free: queue order, each kind from its own slots
        ([stream(10), t(10), stream(10), t(10)], 1, 1, [0, 1]),
        # a slot-blocked stream is no head: a job behind it needs no reservation
        ([stream(10), t(90)], 1, 0, [1]),
        # without stream slots of their own, streams take job slots
        ([stream(10), t(10)], 1, None, [0]),
    ],
)
def test_streams_and_jobs_take_slots_of_their_own_kind(queue, free_slots, free_streams, admitted):
    planned = plan_admissions(
        queue,
        free_bytes=100,
        free_slots=free_slots,
        running=[],
        now=0.0,
        exclusive_running=False,
        max_head_bypass=2,
        free_stream_slots=free_streams,
    )
    assert planned.start == admitted
