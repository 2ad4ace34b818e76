"""The executor: a dedicated, explicitly sized inference thread pool that measures peaks.

Device work never runs on FastAPI's shared pool. Each job's peak is measured with the
device's high-water mark; the mark is global, so a peak only counts as the job's own
when no other job ran at any time during it (`Measurement.alone`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from app.devices.base import Device

T = TypeVar("T")


def drop_references(exc: BaseException) -> None:
    """Let go of what a failed job's frames still hold (activations, a KV cache): the
    exception's traceback keeps those frames, and their tensors, alive, so emptying the
    allocator's cache before this gives nothing back."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__


@dataclass(frozen=True)
class Measurement:
    peak_bytes: int
    run_s: float
    alone: bool


class Executor:
    def __init__(
        self, device: Device, *, slots: int, stream_slots: int = 0, cpu_threads: int = 0
    ) -> None:
        """`slots` threads run one-shot jobs; `stream_slots` threads of their own run
        generation streams (0: streams run on the job threads). Separate pools, so that
        one-shot traffic alone never starts a thread beyond `slots`: each thread that runs
        torch on the CPU keeps an OpenMP team, and more teams than cores slow every
        forward (see `run_in_own_thread`)."""
        self.device = device
        self.slots = slots
        self.stream_slots = stream_slots
        self._device_pool = ThreadPoolExecutor(slots, thread_name_prefix="vramgate-infer")
        self._stream_pool = (
            ThreadPoolExecutor(stream_slots, thread_name_prefix="vramgate-stream")
            if stream_slots
            else self._device_pool
        )
        self._cpu_pool = ThreadPoolExecutor(2, thread_name_prefix="vramgate-cpu")
        self._lock = threading.Lock()  # guards _active and _starts
        self._active = 0
        self._starts = 0
        # on the CPU, concurrent jobs × intra-op threads must not exceed the cores
        self.torch_threads = device.size_threads(cpu_threads, slots)

    async def run_cpu(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._cpu_pool, fn, *args)

    @staticmethod
    async def run_in_own_thread(fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` on a thread that ends with it: for loading and unloading models.

        torch's OpenMP team lives as long as the thread that first ran parallel work, and
        libgomp stops spin-waiting (each parallel region then sleeps and wakes its
        workers) once it manages more threads than there are cores. A loader on a pool
        thread that lives on (asyncio.to_thread) kept a second team alive and made every
        CPU forward ~2 ms slower (9.4 → 11-12 ms for one sentence on 2 cores)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def settle(result: T | None, error: BaseException | None) -> None:
            if done.cancelled():
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(result)  # type: ignore[arg-type]

        def target() -> None:
            result, error = None, None
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting task
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, result, error)

        threading.Thread(target=target, name="vramgate-load", daemon=True).start()
        return await done

    async def run_load(self, fn: Callable[..., T], *args: Any) -> tuple[T, bool]:
        """Load (or unload) a model on a thread of its own (see `run_in_own_thread`), as
        device work: a job that overlaps it is no clean sample, since the load's
        allocations would land in its peak. Returns the result and whether the load ran
        with no job on the device (its own growth in memory is then all its own)."""
        with self._lock:
            alone, my_start = self._begin_locked()
        try:
            result = await self.run_in_own_thread(fn, *args)
        finally:
            with self._lock:
                clean = self._alone_throughout_locked(alone, my_start)
                self._active -= 1
        return result, clean

    def submit_device(
        self, fn: Callable[..., T], *args: Any, stream: bool = False
    ) -> asyncio.Future[tuple[T, Measurement]]:
        """Start `fn` on the inference pool (a generation `stream` on the stream pool).
        The future resolves when the device is done."""
        loop = asyncio.get_running_loop()
        pool = self._stream_pool if stream else self._device_pool
        return loop.run_in_executor(pool, self._measured, fn, args)

    def _measured(self, fn: Callable[..., T], args: tuple[Any, ...]) -> tuple[T, Measurement]:
        with self._lock:
            alone, my_start = self._begin_locked()
            if alone:
                self.device.begin_peak()
            base = self.device.allocated()
        started = time.perf_counter()
        try:
            with self.device.job_stream():  # on CUDA: this thread's stream, waited for alone
                result = fn(*args)
                self.device.synchronize()
            run_s = time.perf_counter() - started
            with self._lock:
                clean = self._alone_throughout_locked(alone, my_start)
                peak = max(0, self.device.peak() - base) if clean else 0
            return result, Measurement(peak, run_s, clean)
        finally:
            with self._lock:
                self._active -= 1

    def _begin_locked(self) -> tuple[bool, int]:
        """Count one more piece of device work (a job or a load); under the lock. Returns
        whether the device was idle, and the work's start number."""
        alone = self._active == 0
        self._active += 1
        self._starts += 1
        return alone, self._starts

    def _alone_throughout_locked(self, alone: bool, my_start: int) -> bool:
        """Whether work that began `alone` saw no other work start; under the lock."""
        return alone and self._starts == my_start

    def empty_cache(self) -> None:
        """Give the allocator's unused cache back to the driver, as device work: a peak
        measured across it would miss the memory given back and taken again."""
        with self._lock:
            self._starts += 1
            self.device.empty_cache()

    @property
    def active(self) -> int:
        return self._active

    @property
    def starts(self) -> int:
        """How many jobs and loads have started: changes whenever the device worked."""
        return self._starts

    def shutdown(self, wait: bool = True) -> None:
        self._device_pool.shutdown(wait=wait, cancel_futures=True)
        self._stream_pool.shutdown(wait=wait, cancel_futures=True)
        self._cpu_pool.shutdown(wait=wait, cancel_futures=True)
