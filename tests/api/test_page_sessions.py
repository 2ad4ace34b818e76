"""The dashboard's sign-in sessions (app.api.page_sessions): random ids kept in memory,
each with its own page key, ending at a fixed time after sign-in; a fake clock."""

from __future__ import annotations

from app.api.page_sessions import PageSessions


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_ends_at_its_lifetime_and_is_forgotten():
    clock = Clock()
    sessions = PageSessions(lifetime_s=3600, clock=clock)
    session = sessions.open()
    assert sessions.find(session.id) == session
    clock.now += 3599
    assert sessions.find(session.id) == session  # used or not, its end does not move
    clock.now += 1
    assert sessions.find(session.id) is None
    clock.now -= 10  # a clock read once more cannot bring it back
    assert sessions.find(session.id) is None


def test_ids_and_keys_are_random_apart_and_unknown_ones_find_nothing():
    sessions = PageSessions(lifetime_s=3600, clock=Clock())
    opened = [sessions.open() for _ in range(20)]
    secrets = [s.id for s in opened] + [s.key for s in opened]
    assert len(set(secrets)) == 40 and all(len(s) >= 43 for s in secrets)
    for unknown in (None, "", "x", opened[0].key):
        assert sessions.find(unknown) is None


def test_sign_ins_beyond_the_bound_end_the_oldest_sessions_first():
    sessions = PageSessions(lifetime_s=3600, clock=Clock(), most=3)
    first, second, *rest = [sessions.open() for _ in range(4)]
    assert sessions.find(first.id) is None
    assert sessions.find(second.id) == second
    assert all(sessions.find(s.id) == s for s in rest)
