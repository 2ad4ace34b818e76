"""The allocator's cache goes back to the driver: after a few idle seconds, and at once
when other programs press. A GPU card stands in (tests/engine/fake_cuda: torch's caching
allocator and the driver's free memory); the decision runs through the server's own
housekeeping step (`ModelLifecycle.reclaim`) on a fleet built as the server builds it."""

from __future__ import annotations

import asyncio

from app.config.settings import ModelSpec, SimulatedBucket
from app.core.fleet.fleet import build_fleet
from app.devices.cuda import CudaDevice
from tests.support.fake_cuda import CachingCuda, CardNvml
from tests.support.live import make_settings

GiB = 2**30
MiB = 2**20


def _lane(tmp_path, card: CachingCuda, now: list[float]):
    device = CudaDevice(0, nvml=CardNvml(card), cuda=card)
    model = ModelSpec(  # never loaded here: the card's memory is the allocator's alone
        name="m", kind="simulated", buckets=(SimulatedBucket(size=16, bytes=MiB, run_ms=1),)
    )
    settings = make_settings(tmp_path, device="cuda:0", models=(model,), reserve=512 * MiB)
    return build_fleet(settings, [device], clock=lambda: now[0]).lanes[0]


def _burst(lane, card: CachingCuda, nbytes: int) -> None:
    """A job's activations, freed when it ends: torch keeps their segments cached."""

    def job() -> None:
        handles = [card.alloc(GiB) for _ in range(nbytes // GiB)]
        for handle in handles:
            card.free(handle)

    async def run() -> None:
        await lane.executor.submit_device(job)

    asyncio.run(run())


def test_idle_cache_goes_back_to_the_driver_after_a_few_seconds(tmp_path):
    now = [1000.0]
    card = CachingCuda(total=24 * GiB)
    lane = _lane(tmp_path, card, now)
    _burst(lane, card, 4 * GiB)
    after_burst = card.free_on_card()
    lane.lifecycle.reclaim()  # right after a job: the next one may well reuse it
    assert card.free_on_card() == after_burst
    now[0] += 10  # idle: a game started now would find 4 GiB less than there is
    lane.lifecycle.reclaim()
    assert card.free_on_card() == after_burst + 4 * GiB
    assert lane.memory.snapshot(fresh=True).used_by_others == 0
    lane.executor.shutdown()


def test_cache_goes_back_at_once_when_other_programs_press(tmp_path):
    now = [1000.0]
    card = CachingCuda(total=24 * GiB)
    lane = _lane(tmp_path, card, now)
    _burst(lane, card, 4 * GiB)
    # a game takes what the driver has, into the memory we leave other programs
    card.others = card.free_on_card() - 100 * MiB
    lane.lifecycle.reclaim()
    assert card.free_on_card() == 100 * MiB + 4 * GiB
    lane.executor.shutdown()
