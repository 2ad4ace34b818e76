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
