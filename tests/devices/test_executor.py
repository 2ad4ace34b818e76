"""The executor measures a job's peak only when it ran alone."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.devices.executor import Executor
from app.devices.simulated import SimulatedDevice

MiB = 2**20


def test_a_lone_job_gets_its_own_peak():
    device = SimulatedDevice(1000 * MiB)
    executor = Executor(device, slots=2, cpu_threads=1)

    def job() -> str:
        with device.hold(30 * MiB):
            pass
        return "done"

    async def main():
        return await executor.submit_device(job)

    result, measurement = asyncio.run(main())
    assert result == "done"
    assert measurement.alone and measurement.peak_bytes == 30 * MiB
    executor.shutdown()


def test_overlapping_jobs_are_not_credited_with_a_peak():
    device = SimulatedDevice(1000 * MiB)
    executor = Executor(device, slots=2, cpu_threads=1)
    both_inside = threading.Barrier(2)

    def job(nbytes: int) -> int:
        with device.hold(nbytes):
            both_inside.wait(timeout=10)
        return nbytes

    async def main():
        return await asyncio.gather(
            executor.submit_device(job, 10 * MiB), executor.submit_device(job, 20 * MiB)
        )

    results = asyncio.run(main())
    assert [m.alone for _, m in results] == [False, False]
    assert executor.active == 0
    executor.shutdown()


def test_torch_threads_are_sized_to_cores_per_job():
    import os

    executor = Executor(SimulatedDevice(MiB), slots=os.cpu_count() or 1)
    assert executor.torch_threads == 1
    executor.shutdown()


def test_run_in_own_thread_returns_and_the_thread_ends():
    """Loading runs on a thread that ends with it, so no pool thread keeps an OpenMP team."""
    seen: list[threading.Thread] = []

    def load(x: int) -> int:
        seen.append(threading.current_thread())
        return x * 2

    async def main() -> int:
        return await Executor.run_in_own_thread(load, 21)

    assert asyncio.run(main()) == 42
    (thread,) = seen
    assert thread is not threading.main_thread() and thread.name == "vramgate-load"
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_run_in_own_thread_hands_the_error_to_the_caller():
    def broken() -> None:
        raise OSError("weights missing")

    async def main() -> None:
        await Executor.run_in_own_thread(broken)

    with pytest.raises(OSError, match="weights missing"):
        asyncio.run(main())


def test_a_job_that_overlaps_a_load_is_no_clean_sample_nor_is_the_load():
    """A load's allocations would land in the job's peak (and the job's in the load's)."""
    device = SimulatedDevice(1000 * MiB)
    executor = Executor(device, slots=2, cpu_threads=1)
    job_inside, load_done = threading.Event(), threading.Event()

    def load() -> str:
        job_inside.wait(5)
        with device.hold(200 * MiB):  # weights arriving while the job runs
            load_done.set()
        return "loaded"

    def job() -> None:
        with device.hold(10 * MiB):
            job_inside.set()
            load_done.wait(5)

    async def main():
        work = executor.submit_device(job)
        loaded = await executor.run_load(load)
        return await work, loaded

    (_, measurement), (result, load_alone) = asyncio.run(main())
    assert result == "loaded"
    assert not measurement.alone and measurement.peak_bytes == 0
    assert not load_alone
    executor.shutdown()


def test_a_load_on_an_idle_device_is_alone():
    executor = Executor(SimulatedDevice(MiB), slots=1, cpu_threads=1)
    assert asyncio.run(executor.run_load(lambda: 7)) == (7, True)
    executor.shutdown()


def test_drop_references_frees_the_failed_jobs_tensors():
    """An out-of-memory's traceback keeps the failed forward's frames, and their tensors,
    alive: emptying the cache before they are let go gives nothing back."""
    import weakref

    import torch

    from app.devices.executor import drop_references

    held: list[weakref.ref] = []

    def forward() -> None:
        activations = torch.ones(1024)
        held.append(weakref.ref(activations))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    executor = Executor(SimulatedDevice(MiB), slots=1, cpu_threads=1)

    async def main() -> BaseException:
        try:
            await executor.submit_device(forward)
        except torch.OutOfMemoryError as exc:
            return exc
        raise AssertionError("no error")

    error = asyncio.run(main())
    assert held[0]() is not None  # still held by the exception's frames
    drop_references(error)
    assert held[0]() is None
    executor.shutdown()


def _cuda_card():
    from app.devices.cuda import CudaDevice
    from tests.support.fake_cuda import CachingCuda, CardNvml

    card = CachingCuda()
    return CudaDevice(0, nvml=CardNvml(card), cuda=card), card


def test_a_cuda_jobs_price_is_the_memory_the_allocator_had_to_reserve_for_it():
    """What fails a job on a GPU is the allocator's segments growing past what the card
    has, not its live tensors: three 1.5 MiB tensors hold 4.5 MiB, but torch's caching
    allocator takes a 20 MiB segment for them (kLargeBuffer, see tests/engine/fake_cuda).
    A learned price of 4.5 MiB would admit four such jobs into 18 MiB of room."""
    device, card = _cuda_card()
    executor = Executor(device, slots=1, cpu_threads=1)

    def job() -> None:
        handles = [card.alloc(3 * MiB // 2) for _ in range(3)]
        for handle in handles:
            card.free(handle)

    async def main():
        return await executor.submit_device(job)

    _, cold = asyncio.run(main())
    assert cold.alone and cold.peak_bytes == 20 * MiB
    # The segment stays cached: the same job again reserves nothing new, and its price
    # must not fall to nothing: what it holds live is still its own.
    _, warm = asyncio.run(main())
    assert warm.alone and warm.peak_bytes == 3 * (3 * MiB // 2)
    executor.shutdown()
