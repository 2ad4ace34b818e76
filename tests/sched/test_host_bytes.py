"""The host-bytes ledger (app.sched.host_bytes): leases take within the bound, never
past it, and give back exactly what they took, once."""

from __future__ import annotations

import threading

from app.sched.host_bytes import HostBytes


def test_leases_take_within_the_bound_and_give_back_once():
    ledger = HostBytes(100)
    first, second = ledger.lease(), ledger.lease()
    assert first.take(60) and not second.take(50) and second.take(40)
    assert ledger.held == 100
    first.give(10)
    first.close()
    first.close()  # closing twice gives nothing back twice
    assert ledger.held == 40 and not first.take(1)  # a closed lease takes nothing
    second.close()
    assert ledger.held == 0


def test_of_two_takers_checking_at_once_only_one_passes():
    """Two leases of 60 check a ledger of 100 at the same moment: the first, between its
    check and its take, lets the second take on another thread. The ledger's lock keeps
    the second waiting until the first has taken (so it is refused); without it both
    would see room and take 120."""
    others: list[threading.Thread] = []
    second_took: list[bool] = []

    class Limit(int):
        """The ledger's limit; Python asks a subclass first, so `held + n > limit` is
        `limit.__lt__(held + n)`: where the first check happens, the second taker runs."""

        def __lt__(self, other: int) -> bool:
            if not others:
                others.append(threading.Thread(target=lambda: second_took.append(second.take(60))))
                others[0].start()
                # without a lock the second is done at once; with one it waits for ours:
                # a second, then ours goes on
                others[0].join(timeout=1)
            return int(self) < other

    ledger = HostBytes(Limit(100))
    first, second = ledger.lease(), ledger.lease()
    assert first.take(60)
    others[0].join()
    assert second_took == [False] and ledger.held == first.held == 60 and second.held == 0
