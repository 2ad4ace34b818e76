"""A GPU driver that spills into system RAM (Windows' Sysmem Fallback) is said: runs far
slower than learned while the card is nearly full. The pure watch with a table, then the
whole server on a simulated GPU that is filled by "another program" and whose model
runs slowly on chosen calls."""

from __future__ import annotations

import httpx
import pytest

from app.config.settings import ModelSpec, SimulatedBucket
from app.config.simulated_spec import FaultInjection
from app.core.health.spill import SPILL_WARNING, SpillWatch

GiB, MiB = 2**30, 2**20


@pytest.mark.parametrize(
    ("runs", "spilling"),
    [
        ([(1.0, 0.1, 10, 1000)] * 3, True),  # 10x slower, 1% free, three times
        ([(1.0, 0.1, 10, 1000)] * 2, False),  # twice is not yet a pattern
        ([(1.0, 0.1, 500, 1000)] * 5, False),  # slow with room: another cause
        ([(0.2, 0.1, 10, 1000)] * 5, False),  # full, but at its learned speed
        ([(1.0, 0.1, 10, 1000)] * 3 + [(0.1, 0.1, 10, 1000)], False),  # fast again
        ([(1.0, 0.0, 10, 1000)] * 5, False),  # nothing learned yet
    ],
)
def test_spilling_is_slow_runs_on_a_full_card_in_a_row(runs, spilling):
    watch = SpillWatch()
    for run in runs:
        watch.observe(*run)
    assert watch.spilling is spilling


def test_a_spilling_gpu_is_said_in_status_and_unsaid_when_runs_are_fast_again(server_factory):
    hangs = (40, 41, 42)
    model = ModelSpec(
        name="sim",
        kind="simulated",
        buckets=(SimulatedBucket(size=16, bytes=MiB, run_ms=2),),
        inject=FaultInjection(hang_on_calls=hangs, hang_ms=400),
    )
    live = server_factory(device="simulated:1GiB", reserve=0, models=(model,))
    handler = live.service.registry.entries["sim"].handler

    def embed() -> None:
        r = httpx.post(live.url + "/v1/embeddings", json={"model": "sim", "input": "a b c"})
        assert r.status_code == 200, r.text

    def warnings() -> list[str]:
        return live.status()["device"]["warnings"]

    while handler.forward_calls < hangs[0] - 1:  # learned: fast runs, room to spare
        embed()
    assert SPILL_WARNING not in warnings()
    live.service.device.set_external(GiB - 20 * MiB)  # another program fills the card
    for _ in hangs:
        embed()
    assert SPILL_WARNING in warnings()
    embed()  # at its learned speed again
    assert SPILL_WARNING not in warnings()
