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


def test_threads_taking_at_once_never_pass_the_bound():
    ledger = HostBytes(1_000)
    leases = [ledger.lease() for _ in range(8)]
    took = [0] * len(leases)

    def take(i: int) -> None:
        for _ in range(500):
            took[i] += leases[i].take(1)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(leases))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(took) == ledger.held == 1_000
    for lease in leases:
        lease.close()
    assert ledger.held == 0
