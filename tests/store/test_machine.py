"""This machine's rooms for a model (app.store.machine), read from a running server's
/status: the device with the most free for a model now, the most it has, the host's RAM."""

from __future__ import annotations

from app.store import machine as machine_module
from app.store.machine import Machine

GiB = 2**30


def test_the_machine_is_read_from_a_servers_status(monkeypatch):
    monkeypatch.setattr(machine_module, "host_memory", lambda: (3 * GiB, 8 * GiB))
    rows = [
        {"name": "A", "kind": "cuda", "pool_bytes": 5 * GiB, "admitted_bytes": 4 * GiB,
         "total_bytes": 8 * GiB, "reserve_bytes": GiB},
        {"name": "B", "kind": "cuda", "pool_bytes": 3 * GiB, "admitted_bytes": 0,
         "total_bytes": 6 * GiB, "reserve_bytes": GiB},
    ]  # fmt: skip
    machine = machine_module.machine_from_status({"devices": rows})
    assert machine == Machine("B", True, 3 * GiB, 5 * GiB, 3 * GiB, 8 * GiB)
