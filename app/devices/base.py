"""What a device is to the server, torch-free: how much memory there is, how much is
ours, our peak during a job, and which errors mean it ran out or is lost.

Every device the server runs on is also one an in-process engine puts tensors on
(app.devices.torch_backed): `CudaDevice` (app.devices.cuda) asks the driver (NVML) for
totals and torch.cuda for our own use; `CpuDevice` (app.devices.cpu) answers the same
questions from system RAM; `SimulatedDevice` (app.devices.simulated) has a fixed capacity
with exact accounting and raises torch's own OutOfMemoryError when over-committed, so the
whole server can be exercised without a GPU. The core, the routes and the runner engine
see only this base.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from dataclasses import fields as dataclass_fields
from typing import Any

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
    # what our runner processes hold past the figures their engines reported at load
    # (a large prefill's buffers, the interpreter): ours, in `ours`, and no job's
    runners_beyond: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclass_fields(cls))


class Device(ABC):
    kind: str
    name: str
    id: str  # names this device among the server's: cpu, cuda:1, simulated:0
    default_reserve: int
    default_slots: int
    warnings: tuple[str, ...] = ()  # what the user should fix (shown in /status, the tray)
    tensors_on = "cpu"  # where an in-process engine's tensors go, as torch names it

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

    @abstractmethod
    def hold(self, nbytes: int) -> contextlib.AbstractContextManager[None]:
        """Really occupy `nbytes` on the device for the duration (simulated models)."""

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
        """Out of device memory, as the texts above say it (a torch-backed device also
        knows torch's own OutOfMemoryError)."""
        return isinstance(exc, RuntimeError) and bool(_OOM_PATTERNS.search(str(exc)))

    def is_fatal(self, exc: BaseException) -> bool:
        if self.is_oom(exc) or not isinstance(exc, RuntimeError):
            return False
        return bool(_FATAL_PATTERNS.search(str(exc)))

    def size_threads(self, cpu_threads: int, slots: int) -> int:
        """How many intra-op threads each of `slots` concurrent jobs may use
        (`cpu_threads`, 0: the device's choice); an in-process engine sets it."""
        return max(1, cpu_threads)

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "name": self.name,
            "torch_device": self.tensors_on,
            "warnings": list(self.warnings),
        }
