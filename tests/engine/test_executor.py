"""The executor measures a job's peak only when it ran alone."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.engine.device import SimulatedDevice
from app.engine.executor import Executor

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
