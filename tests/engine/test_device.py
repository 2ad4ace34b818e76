"""Devices: the simulated one's exact accounting and torch's OOM class; the CPU one's
real readings; error classification."""

from __future__ import annotations

import threading

import pytest
import torch

from app.engine.device import CpuDevice, SimulatedDevice, make_device
from app.settings import load_settings

MiB = 2**20


def test_simulated_device_raises_torchs_out_of_memory_and_keeps_its_high_water():
    device = SimulatedDevice(100 * MiB)
    with device.hold(60 * MiB):
        assert device.snapshot().free == 40 * MiB
        with pytest.raises(torch.OutOfMemoryError), device.hold(50 * MiB):
            pass
    assert device.oom_count == 1
    assert device.high_water == 60 * MiB
    assert device.allocated() == 0


def test_simulated_device_counts_other_programs():
    device = SimulatedDevice(100 * MiB)
    device.set_external(70 * MiB)
    snap = device.snapshot()
    assert (snap.used_by_others, snap.free_for_us) == (70 * MiB, 30 * MiB)
    with pytest.raises(torch.OutOfMemoryError), device.hold(40 * MiB):
        pass


def test_simulated_peak_is_resettable_and_thread_safe():
    device = SimulatedDevice(1000 * MiB)
    device.begin_peak()
    barrier = threading.Barrier(4)

    def worker() -> None:
        with device.hold(10 * MiB):
            barrier.wait()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert device.peak() == 40 * MiB
    device.begin_peak()
    assert device.peak() == 0


def test_cpu_device_reads_real_memory_and_measures_a_real_peak():
    device = CpuDevice()
    snap = device.snapshot()
    assert snap.total > snap.free > 0 and snap.ours > 0
    device.begin_peak()
    base = device.allocated()
    with device.hold(64 * MiB):
        pass
    assert device.peak() - base >= 60 * MiB


def test_fatal_errors_are_told_from_ordinary_ones():
    device = SimulatedDevice(MiB)
    assert device.is_fatal(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert device.is_fatal(RuntimeError("CUDA error: device-side assert triggered"))
    assert not device.is_fatal(RuntimeError("shape mismatch"))
    assert not device.is_fatal(torch.OutOfMemoryError("CUDA out of memory"))
    assert device.is_oom(torch.OutOfMemoryError("x"))


def test_auto_without_a_driver_serves_on_the_cpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    settings = load_settings({"device": "auto"}, tmp_path / "none.toml")
    assert make_device(settings).kind == "cpu"


def test_cuda_without_a_driver_says_so(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    settings = load_settings({"device": "cuda:0"}, tmp_path / "none.toml")
    with pytest.raises(RuntimeError, match=r"NVIDIA driver|CUDA"):
        make_device(settings)


class FakeNvml:
    """Stands in for the NVIDIA driver, which this machine does not have."""

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    def __init__(self, total: int, free: int, ours: int | None, present: bool = True) -> None:
        self.total, self.free, self.ours, self.present = total, free, ours, present

    def nvmlInit(self) -> None:
        if not self.present:
            raise self.NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu{index}"

    def nvmlDeviceGetMemoryInfo(self, handle: str):
        return type("Info", (), {"total": self.total, "free": self.free})()

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str):
        import os

        if self.ours is None:
            raise self.NVMLError("not supported")
        return [type("Proc", (), {"pid": os.getpid(), "usedGpuMemory": self.ours})()]

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"580.00"


class FakeCudaStats:
    """torch.cuda's memory statistics as the CUDA caching allocator reports them."""

    def __init__(self, allocated: int, reserved: int) -> None:
        self.allocated, self.reserved, self.peak = allocated, reserved, allocated

    def is_available(self) -> bool:
        return True

    def get_device_name(self, index: int) -> str:
        return "Fake RTX"

    def memory_allocated(self, index: int) -> int:
        return self.allocated

    def memory_reserved(self, index: int) -> int:
        return self.reserved

    def max_memory_allocated(self, index: int) -> int:
        return self.peak

    def reset_peak_memory_stats(self, index: int) -> None:
        self.peak = self.allocated


def test_fake_driver_cuda_snapshot_counts_cached_memory_as_ours_to_use():
    from app.engine.device import CudaDevice

    gib = 2**30
    stats = FakeCudaStats(allocated=2 * gib, reserved=3 * gib)
    device = CudaDevice(
        0, nvml=FakeNvml(total=24 * gib, free=10 * gib, ours=int(3.5 * gib)), cuda=stats
    )
    snap = device.snapshot()
    assert snap.free_for_us == 11 * gib  # driver free + cached but unused
    assert snap.ours == int(3.5 * gib)  # the driver's view includes the CUDA context
    assert snap.used_by_others == int(10.5 * gib)  # 14 used, 3.5 of it ours
    assert device.describe()["driver"] == "580.00" and device.key == "cuda:Fake RTX"


def test_fake_driver_without_per_process_figures_falls_back_to_reserved():
    from app.engine.device import CudaDevice

    stats = FakeCudaStats(allocated=100, reserved=300)
    device = CudaDevice(0, nvml=FakeNvml(total=1000, free=500, ours=None), cuda=stats)
    assert device.snapshot().ours == 300 and device.snapshot().used_by_others == 200


def test_fake_driver_missing_means_no_nvidia_driver():
    from app.engine.device import CudaDevice

    with pytest.raises(RuntimeError, match="no NVIDIA driver"):
        CudaDevice(0, nvml=FakeNvml(0, 0, None, present=False), cuda=FakeCudaStats(0, 0))
