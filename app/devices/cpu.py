"""System RAM as the device, for a CPU-only user: our use is the process's resident set
(and our runner processes'), a job's peak the kernel's high-water mark of it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable

import psutil
import torch

from app.devices.base import GiB, MemorySnapshot, MiB
from app.devices.torch_backed import TorchBacked


class CpuDevice(TorchBacked):
    """System RAM as the device: protects a CPU-only user from exhausting memory.

    Our use is the process's resident set. A job's peak is the kernel's high-water mark
    of it (reset through /proc/self/clear_refs on Linux); large tensors (>= 32 MiB) are
    made to come from mmap so that freeing them gives the pages back and the next peak
    sees them again; smaller ones reuse the heap (see `_return_large_frees_to_os`).
    Where the OS keeps no high-water mark a program can reset (Windows, macOS), the
    resident set is sampled while a job runs (`_PeakSampler`; `sample_peak=True` takes
    that path on Linux too).
    """

    kind = "cpu"
    default_reserve = 1 * GiB
    default_slots = 1

    def __init__(self, warnings: tuple[str, ...] = (), *, sample_peak: bool = False) -> None:
        self.warnings = warnings
        self.torch_device = torch.device("cpu")
        self.id = "cpu"
        self.name = f"{psutil.cpu_count(logical=True)}-thread CPU"
        self._process = psutil.Process()
        self._runner_procs: dict[int, psutil.Process] = {}  # adopted runners' handles
        # Linux: reads per batch at a few µs, under the GIL
        self._proc = None if sample_peak else _ProcMemory.open()
        self._sampler = _PeakSampler(self._rss) if self._proc is None else None
        self._start_rss = 0
        _return_large_frees_to_os()

    def snapshot(self) -> MemorySnapshot:
        vm = psutil.virtual_memory()
        runners, beyond = self._runners_rss()
        rss = self.allocated() + runners
        return MemorySnapshot(
            total=int(vm.total),
            free=int(vm.available),
            used_by_others=max(0, int(vm.total) - int(vm.available) - rss),
            ours=rss,
            ours_allocated=rss,
            free_for_us=int(vm.available),
            runners_beyond=beyond,
        )

    def _runners_rss(self) -> tuple[int, int]:
        """Our runner processes' resident sets (one that just ended counts nothing), and
        how far they are past what their engines reported."""
        runners = self.runners
        for gone in self._runner_procs.keys() - runners.keys():
            self._runner_procs.pop(gone, None)  # snapshots come from several threads
        total = beyond = 0
        for pid, reported in runners.items():
            try:
                proc = self._runner_procs.get(pid) or psutil.Process(pid)
                self._runner_procs[pid] = proc
                rss = int(proc.memory_info().rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total += rss
            beyond += max(0, rss - reported)
        return total, beyond

    def allocated(self) -> int:
        if self._proc is not None:
            return self._proc.rss()
        return self._rss()

    def _rss(self) -> int:
        return int(self._process.memory_info().rss)

    def begin_peak(self) -> None:
        self._start_rss = self.allocated()
        if self._proc is not None:
            self._proc.reset_high_water()
        if self._sampler is not None:
            self._sampler.reset(self._start_rss)

    def peak(self) -> int:
        now = self.allocated()
        if self._sampler is not None:
            return max(self._sampler.high_water(), now, self._start_rss)
        assert self._proc is not None
        return max(self._proc.high_water(), now)


class _PeakSampler:
    """The resident set's highest value while a job is measured, sampled every
    `INTERVAL_S` on a thread of its own (armed by `reset`, read and disarmed by
    `high_water`). An allocation shorter than the interval can be missed; a batch's large
    activations live for many intervals."""

    INTERVAL_S = 0.001

    def __init__(self, read: Callable[[], int]) -> None:
        self._read = read
        self._high = 0
        self._lock = threading.Lock()
        self._armed = threading.Event()
        threading.Thread(target=self._run, name="peak-sampler", daemon=True).start()

    def reset(self, now: int) -> None:
        with self._lock:
            self._high = now
        self._armed.set()

    def high_water(self) -> int:
        self._armed.clear()
        with self._lock:
            return self._high

    def _run(self) -> None:
        while True:
            self._armed.wait()
            value = self._read()
            with self._lock:
                self._high = max(self._high, value)
            time.sleep(self.INTERVAL_S)


class _ProcMemory:
    """The resident set and its high-water mark from /proc, through files kept open: the
    executor asks three times per batch, and opening and parsing them each time (psutil,
    `open`) cost ~70 µs of GIL-holding time per batch against ~13 µs this way."""

    def __init__(self, statm: int, status: int, clear_refs: int) -> None:
        self._statm, self._status, self._clear_refs = statm, status, clear_refs
        self._page = os.sysconf("SC_PAGE_SIZE")

    @classmethod
    def open(cls) -> _ProcMemory | None:
        if not sys.platform.startswith("linux"):
            return None
        try:
            return cls(
                os.open("/proc/self/statm", os.O_RDONLY),
                os.open("/proc/self/status", os.O_RDONLY),
                os.open("/proc/self/clear_refs", os.O_WRONLY),
            )
        except OSError:
            return None

    def rss(self) -> int:
        return int(os.pread(self._statm, 128, 0).split()[1]) * self._page

    def reset_high_water(self) -> None:
        os.write(self._clear_refs, b"5")  # VmHWM back to the current resident set

    def high_water(self) -> int:
        status = os.pread(self._status, 8192, 0)
        start = status.index(b"VmHWM:") + len(b"VmHWM:")
        return int(status[start : status.index(b"kB", start)]) * 1024


def _return_large_frees_to_os() -> None:
    """glibc: serve allocations >= 32 MiB from mmap so free() returns them at once (the
    large tensors are the ones a peak must see), and keep up to 64 MiB of freed heap for
    reuse. A lower threshold made every forward fault in fresh zeroed pages for its
    activations: measured with all-MiniLM-L6-v2 at batch 32, 1 MiB cost 10-20 % of the
    throughput, all of it in the kernel. The heap kept for reuse stays in our resident
    set, which the CPU pool already counts as ours."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 * MiB)
        libc.mallopt(m_trim_threshold, 64 * MiB)
