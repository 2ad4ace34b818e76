"""Which idle models give their memory up (app.core.lifecycle.eviction): the decisions alone."""

from __future__ import annotations

from app.core.lifecycle.eviction import Need, Resident, choose, need

GiB = 2**30


def test_a_ticket_that_cannot_fit_even_with_nothing_running_needs_the_difference():
    waiting = [("a", GiB // 4), ("c", 2 * GiB)]
    found = need(waiting, pool=GiB, headroom=0, running={"b"})
    assert found == Need("lru", GiB, frozenset({"a", "b", "c"}))


def test_a_ticket_that_only_waits_for_running_work_needs_nothing():
    assert need([("a", GiB)], pool=GiB, headroom=0, running={"a", "b"}) is None


def test_unloads_under_way_count_against_the_shortfall():
    assert need([("c", 2 * GiB)], pool=GiB, headroom=0, running=(), freeing=GiB) is None
    assert need([("c", 2 * GiB)], pool=GiB, headroom=0, running=(), freeing=GiB // 2) == Need(
        "lru", GiB // 2, frozenset({"c"})
    )


def test_less_than_the_headroom_left_is_pressure_and_pins_every_model_with_work():
    found = need([("a", 1)], pool=GiB // 4, headroom=GiB, running={"b"})
    assert found == Need("pressure", 3 * GiB // 4, frozenset({"a", "b"}))
    assert need([], pool=GiB, headroom=GiB, running=()) is None


def test_the_least_recently_used_go_first_until_the_shortfall_is_covered():
    residents = [Resident("new", GiB, 30.0), Resident("old", GiB, 10.0), Resident("mid", GiB, 20.0)]
    chosen = choose(residents, Need("lru", GiB + 1, frozenset()))
    assert [r.name for r in chosen] == ["old", "mid"]


def test_pinned_models_are_never_chosen():
    residents = [Resident("old", GiB, 10.0), Resident("mid", GiB, 20.0)]
    chosen = choose(residents, Need("lru", GiB, frozenset({"old"})))
    assert [r.name for r in chosen] == ["mid"]


def test_a_request_is_not_given_a_partial_eviction_but_other_programs_are():
    residents = [Resident("old", GiB, 10.0), Resident("busy", 4 * GiB, 5.0)]
    assert choose(residents, Need("lru", 2 * GiB, frozenset({"busy"}))) == []
    pressure = choose(residents, Need("pressure", 2 * GiB, frozenset({"busy"})))
    assert [r.name for r in pressure] == ["old"]
