"""An NVIDIA GPU as the device: totals from the driver (NVML), our own use from
torch.cuda, each inference thread on a CUDA stream of its own."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

import torch

from app.devices.base import MemorySnapshot, MiB
from app.devices.nvml import _pynvml, nvml_handle_for
from app.devices.torch_backed import TorchBacked
from app.errors import DeviceUnavailable


class CudaDevice(TorchBacked):
    """An NVIDIA GPU: totals from the driver (NVML), our own use from torch.cuda.

    `nvml` and `cuda` are the pynvml module and torch.cuda; they are parameters so the
    arithmetic can be tested on machines without a GPU.
    """

    kind = "cuda"
    default_reserve = 512 * MiB
    default_slots = 4

    def __init__(
        self,
        index: int = 0,
        *,
        nvml: Any = None,
        cuda: Any = None,
        visible: str | None = None,
    ) -> None:
        """`visible` is CUDA_VISIBLE_DEVICES as the process started (None: unset)."""
        nvml = nvml if nvml is not None else _pynvml()
        self._cuda = cuda if cuda is not None else torch.cuda
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound as exc:
            raise RuntimeError("no NVIDIA driver found (NVML library missing)") from exc
        if not self._cuda.is_available():
            raise RuntimeError("this torch build or machine has no CUDA")
        if not 0 <= index < self._cuda.device_count():
            raise DeviceUnavailable(
                f"cuda:{index} does not exist: this machine has "
                f"{self._cuda.device_count()} CUDA device(s) visible"
            )
        self._nvml = nvml
        self._handle = nvml_handle_for(nvml, self._cuda, index, visible)
        self.index = index
        self.id = f"cuda:{index}"
        self.torch_device = torch.device("cuda", index)
        self.name = self._cuda.get_device_name(index)
        self._pid = os.getpid()
        self._streams = threading.local()  # each inference thread's own CUDA stream
        self._base = (0, 0)  # allocated and reserved bytes at `begin_peak`

    def _used_by_pid(self) -> dict[int, int]:
        """Each process's memory on this GPU, as the driver reports it (Windows' WDDM
        driver reports none: an empty answer)."""
        try:
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except self._nvml.NVMLError:
            return {}
        return {p.pid: int(p.usedGpuMemory) for p in procs if p.usedGpuMemory is not None}

    def process_bytes(self, pid: int) -> int | None:
        return self._used_by_pid().get(pid)

    def child_visible(self) -> str:
        """This GPU by its UUID: an index would be read through the child's own
        CUDA_VISIBLE_DEVICES and CUDA's fastest-first order, perhaps another card."""
        try:
            uuid = self._nvml.nvmlDeviceGetUUID(self._handle)
        except self._nvml.NVMLError:
            return str(self.index)
        return uuid.decode() if isinstance(uuid, bytes) else str(uuid)

    def snapshot(self) -> MemorySnapshot:
        info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        total, free = int(info.total), int(info.free)
        reserved = int(self._cuda.memory_reserved(self.index))
        allocated = int(self._cuda.memory_allocated(self.index))
        by_pid = self._used_by_pid()
        # runners: the driver's figure per process, else what their engine reported
        runners = sum(by_pid.get(pid, reported) for pid, reported in self.runners.items())
        beyond = sum(
            max(0, by_pid.get(pid, reported) - reported) for pid, reported in self.runners.items()
        )
        own = by_pid.get(self._pid)
        ours = (own or reserved) + runners
        # the CUDA context and what else the driver holds for us outside torch's
        # allocator (unknown where the driver reports no process: Windows' WDDM)
        outside = max(0, own - reserved) if own else 0
        allowed = self._allowed(total)  # a per-process memory fraction caps the allocator
        grow = min(free, max(0, allowed - reserved)) if allowed is not None else free
        return MemorySnapshot(
            total=total,
            free=free,
            used_by_others=max(0, total - free - ours),
            ours=ours,
            ours_allocated=allocated + runners,
            free_for_us=grow + max(0, reserved - allocated),
            outside=outside if allowed is None else max(outside, total - allowed),
            runners_beyond=beyond,
        )

    def _allowed(self, total: int) -> int | None:
        """The most torch's allocator may reserve under a per-process memory fraction
        (torch.cuda.set_per_process_memory_fraction; None: no fraction set). Past it the
        allocator raises out of memory whatever the card has free (c10/cuda/
        CUDACachingAllocator.cpp: `allowed_memory_maximum`, fraction × the total)."""
        get = getattr(self._cuda, "get_per_process_memory_fraction", None)  # newer torch
        fraction = float(get(self.index)) if get is not None else 1.0
        return int(fraction * total) if fraction < 1.0 else None

    def allocated(self) -> int:
        return int(self._cuda.memory_allocated(self.index))

    def begin_peak(self) -> None:
        self._cuda.reset_peak_memory_stats(self.index)
        self._base = (self.allocated(), int(self._cuda.memory_reserved(self.index)))

    def peak(self) -> int:
        """The high-water mark of our allocations, or, where it grew more, of what the
        caching allocator reserved (counted from the allocations at `begin_peak`): a job
        fails when the allocator's segments cannot grow, and they grow by more than its
        tensors (requests rounded up to 2 MiB segments, 20 MiB ones for 1-10 MiB
        tensors, a cuBLAS workspace per new stream). From a warm cache the segments do
        not grow at all: the tensors' own growth is then the larger."""
        allocated, reserved = self._base
        grown = int(self._cuda.max_memory_reserved(self.index)) - reserved
        return max(int(self._cuda.max_memory_allocated(self.index)), allocated + grown)

    def empty_cache(self) -> None:
        self._cuda.empty_cache()

    def cached(self) -> int:
        reserved = int(self._cuda.memory_reserved(self.index))
        return max(0, reserved - int(self._cuda.memory_allocated(self.index)))

    def job_stream(self) -> contextlib.AbstractContextManager[Any]:
        stream = getattr(self._streams, "stream", None)
        if stream is None:
            stream = self._streams.stream = self._cuda.Stream(device=self.index)
        return self._cuda.stream(stream)

    def synchronize(self) -> None:
        """Wait for this thread's job only: a device-wide synchronize would also wait for
        every other job on the device and inflate this one's run time."""
        self._cuda.current_stream(self.index).synchronize()

    def settle(self) -> None:
        """A load's copies of the weights run on the loader's stream, and a copy from
        pageable memory may still be in flight when it returns; the inference threads'
        own streams do not wait for it, so a load ends with the whole device settled."""
        self._cuda.synchronize(self.index)

    @property
    def capability(self) -> tuple[int, int]:
        """The GPU's compute capability (major, minor)."""
        major, minor = self._cuda.get_device_capability(self.index)
        return int(major), int(minor)

    def native_bf16(self) -> bool:
        """bfloat16 is native from compute capability 8.0 (Ampere);
        torch.cuda.is_bf16_supported() also says yes where it is emulated."""
        return self.capability >= (8, 0)

    def describe(self) -> dict[str, Any]:
        driver = self._nvml.nvmlSystemGetDriverVersion()
        return {
            **super().describe(),
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "cuda": torch.version.cuda,
        }
