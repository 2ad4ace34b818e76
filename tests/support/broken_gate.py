"""A deliberately broken admission, to show that the memory assertions of the simulated
end-to-end tests can fail: they must fail with it and pass without it.

    pytest -p tests.support.broken_gate --broken-gate=bytes \
        tests/scenarios/test_flood_simulated.py
    pytest -p tests.support.broken_gate --broken-gate=reserve \
        tests/scenarios/test_flood_simulated.py

`bytes`: the pure planner is told every queued job fits (an admission by count, as the
servers vramgate exists to replace); `reserve`: the pool and the capacity leave nothing
to other programs (the reserve ignored). Loaded only with `-p`; never by default.
"""

from __future__ import annotations

from typing import Any

import pytest

UNBOUNDED = 1 << 62


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--broken-gate", choices=("bytes", "reserve"), default=None)


@pytest.fixture(autouse=True)
def broken_gate(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    how = request.config.getoption("--broken-gate")
    if how == "bytes":
        import app.sched.gate as gate

        real = gate.plan_admissions

        def by_count(*args: Any, **kwargs: Any) -> Any:
            return real(*args, **{**kwargs, "free_bytes": UNBOUNDED})

        monkeypatch.setattr(gate, "plan_admissions", by_count)
    elif how == "reserve":
        from app.core.memory import MemoryView

        pool, device = MemoryView.pool_bytes, MemoryView.device_bytes
        monkeypatch.setattr(MemoryView, "pool_bytes", lambda self: pool(self) + self.reserve)
        monkeypatch.setattr(MemoryView, "device_bytes", lambda self: device(self) + self.reserve)
