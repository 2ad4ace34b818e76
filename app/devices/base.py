"""Devices: how much memory there is, how much is ours, and our peak during a job.

`CudaDevice` (app.devices.cuda) asks the driver (NVML) for totals and torch.cuda for our
own use; `CpuDevice` answers the same questions from system RAM; `SimulatedDevice` has a fixed
capacity with exact accounting and raises torch's own OutOfMemoryError when
over-committed, so the whole server can be exercised without a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from dataclasses import fields as dataclass_fields
from typing import Any

import psutil
import torch

log = logging.getLogger("vramgate.device")

GiB = 2**30
MiB = 2**20
_HELD_LOCK = threading.Lock()  # guards every device's per-thread hold counts (rarely held)

# Allocation failures that torch raises as a plain RuntimeError (torch.AcceleratorError
# from 2.8 on) rather than torch.OutOfMemoryError. The texts are those torch builds:
# - "CUDA error: out of memory": c10/cuda/CUDAException.cpp (C10_CUDA_CHECK), "CUDA error: "
#   + cudaGetErrorString(cudaErrorMemoryAllocation);
# - "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`":
#   aten/src/ATen/cuda/Exceptions.h (TORCH_CUDABLAS_CHECK); likewise CUSOLVER_/CUSPARSE_;
# - "cuDNN error: CUDNN_STATUS_ALLOC_FAILED": the same file's AT_CUDNN_CHECK;
# - "cuFFT error: CUFFT_ALLOC_FAILED": aten/src/ATen/native/cuda/CuFFTUtils.h.
_OOM_PATTERNS = re.compile(
    r"CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|"
    r"CUSOLVER_STATUS_ALLOC_FAILED|CUSPARSE_STATUS_ALLOC_FAILED|CUFFT_ALLOC_FAILED"
)

# Errors after which the CUDA context is unusable: only a fresh process recovers. The
# texts are cudaGetErrorString's, as C10_CUDA_CHECK puts them after "CUDA error: ".
_FATAL_PATTERNS = re.compile(
    r"CUDA error: (an illegal memory access was encountered|device-side assert triggered|"
    r"unspecified launch failure|an illegal instruction was encountered|misaligned address|"
    r"uncorrectable ECC error encountered|the launch timed out and was terminated|"
    r"hardware stack error|invalid program counter|unknown error)",
    re.IGNORECASE,
)


_NO_STREAM = contextlib.nullcontext()


@dataclass(frozen=True)
class MemorySnapshot:
    """One reading of device memory, in bytes."""

    total: int
    free: int  # free for any process, as the driver sees it
    used_by_others: int
    ours: int  # what our process holds on the device (allocator cache included)
    ours_allocated: int  # live tensors
    free_for_us: int  # free + what our allocator holds cached but unused
    # ours outside the allocator (a CUDA context), or beyond what it may reserve (a
    # per-process memory fraction): never the pool's
    outside: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclass_fields(cls))


class Device(ABC):
    kind: str
    name: str
    id: str  # names this device among the server's: cpu, cuda:1, simulated:0
    torch_device: torch.device
    default_reserve: int
    default_slots: int
    warnings: tuple[str, ...] = ()  # what the user should fix (shown in /status, the tray)

    @property
    def key(self) -> str:
        """Names the device in learned prices: a price is only valid on the same kind."""
        return f"{self.kind}:{self.name}"

    @abstractmethod
    def snapshot(self) -> MemorySnapshot: ...

    @abstractmethod
    def allocated(self) -> int:
        """Bytes our process has allocated now (cheap; called around every job)."""

    @abstractmethod
    def begin_peak(self) -> None:
        """Reset the high-water mark of our allocations."""

    @abstractmethod
    def peak(self) -> int:
        """Our allocations' high-water mark since `begin_peak`."""

    def adopt(self, pid: int, nbytes: int) -> None:
        """Count a runner process's memory on this device as ours (a model's runner,
        app.engines.llama_cpp.process): measured per process where the device can, else the
        `nbytes` its engine reported. Without this, a runner's memory reads as another
        program's, and memory given back to other programs would evict our own models."""
        self.__dict__.setdefault("_runners", {})[pid] = nbytes

    def release(self, pid: int) -> None:
        """The runner `pid` ended: its memory is no longer ours."""
        self.__dict__.setdefault("_runners", {}).pop(pid, None)

    def process_bytes(self, pid: int) -> int | None:
        """What process `pid` holds on this device as the driver reports it; None where
        it reports nothing per process (the CPU's, a simulated device, Windows' WDDM)."""
        return None

    def child_visible(self) -> str:
        """CUDA_VISIBLE_DEVICES for a child process that must use this device alone, and
        only it ("" keeps a child off every GPU)."""
        return ""

    @property
    def runners(self) -> dict[int, int]:
        """Our runner processes on this device: pid → the bytes their engine reported."""
        return dict(self.__dict__.get("_runners", {}))

    def empty_cache(self) -> None:
        return None

    def cached(self) -> int:
        """Bytes our allocator holds unused (`empty_cache` gives them back)."""
        return 0

    def synchronize(self) -> None:
        return None

    def settle(self) -> None:
        """Wait for all work on the device, of every thread and stream (after a load)."""
        return None

    def native_bf16(self) -> bool:
        """Whether bfloat16 runs natively here (not emulated)."""
        return False

    @contextlib.contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        """Really occupy `nbytes` on the device for the duration (simulated models)."""
        block = torch.empty(max(0, nbytes), dtype=torch.uint8, device=self.torch_device)
        if self.torch_device.type == "cpu":
            block.fill_(0)  # touch the pages so the RAM is really resident
        with self._held_here(nbytes):
            try:
                yield
            finally:
                del block

    @contextlib.contextmanager
    def _held_here(self, nbytes: int) -> Iterator[None]:
        """Counts `nbytes` for the thread that enters the hold, until it is let go (on
        whichever thread: a model's weights are held by its loader, let go by its unload)."""
        thread = threading.get_ident()
        counts: dict[int, int] = self.__dict__.setdefault("_held_by_thread", {})
        with _HELD_LOCK:
            counts[thread] = counts.get(thread, 0) + nbytes
        try:
            yield
        finally:
            with _HELD_LOCK:  # a hold of 0 bytes may come back after the others emptied it
                left = counts.get(thread, 0) - nbytes
                if left:
                    counts[thread] = left
                else:
                    counts.pop(thread, None)

    def held_by_this_thread(self) -> int:
        """What the `hold`s entered on this thread hold now: a simulated generation's
        cache as the device counts it, not as the model says it."""
        counts: dict[int, int] = self.__dict__.get("_held_by_thread", {})
        return counts.get(threading.get_ident(), 0)

    def job_stream(self) -> contextlib.AbstractContextManager[Any]:
        """Where one job's device work is queued (CUDA: the inference thread's own stream,
        so `synchronize` waits for this job only). Elsewhere nothing: one shared null
        context, since this is entered around every job."""
        return _NO_STREAM

    def is_oom(self, exc: BaseException) -> bool:
        """Out of device memory, in any of the forms torch raises it."""
        if isinstance(exc, torch.OutOfMemoryError):
            return True
        return isinstance(exc, RuntimeError) and bool(_OOM_PATTERNS.search(str(exc)))

    def is_fatal(self, exc: BaseException) -> bool:
        if self.is_oom(exc) or not isinstance(exc, RuntimeError):
            return False
        return bool(_FATAL_PATTERNS.search(str(exc)))

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "name": self.name,
            "torch_device": str(self.torch_device),
            "warnings": list(self.warnings),
        }


class CpuDevice(Device):
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
        rss = self.allocated() + self._runners_rss()
        return MemorySnapshot(
            total=int(vm.total),
            free=int(vm.available),
            used_by_others=max(0, int(vm.total) - int(vm.available) - rss),
            ours=rss,
            ours_allocated=rss,
            free_for_us=int(vm.available),
        )

    def _runners_rss(self) -> int:
        """Our runner processes' resident sets (one that just ended counts nothing)."""
        runners = self.runners
        for gone in self._runner_procs.keys() - runners.keys():
            self._runner_procs.pop(gone, None)  # snapshots come from several threads
        total = 0
        for pid in runners:
            try:
                proc = self._runner_procs.get(pid) or psutil.Process(pid)
                self._runner_procs[pid] = proc
                total += int(proc.memory_info().rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return total

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
