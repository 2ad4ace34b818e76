"""A runner process's memory is ours: the device counts an adopted pid's memory with our
own and not as another program's (else giving memory back to other programs would evict
our own models), and forgets it when the runner ends."""

from __future__ import annotations

import subprocess
import sys

import psutil

from app.devices.cpu import CpuDevice
from app.devices.simulated import SimulatedDevice

MiB = 2**20
HOLD = 300 * MiB


def test_a_runners_resident_memory_counts_as_ours_on_the_cpu_not_as_anothers():
    child = subprocess.Popen(
        [sys.executable, "-c", f"b = bytearray({HOLD}); print('ready', flush=True); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        rss = psutil.Process(child.pid).memory_info().rss
        assert rss > HOLD
        device = CpuDevice()
        alone = device.snapshot()
        device.adopt(child.pid, 0)
        adopted = device.snapshot()
        # ours grew by the child's resident set, others' shrank by it (other programs'
        # memory moves a little between two readings: within 32 MiB)
        assert abs((adopted.ours - alone.ours) - rss) < 32 * MiB
        assert abs((alone.used_by_others - adopted.used_by_others) - rss) < 32 * MiB
        device.release(child.pid)
        assert abs(device.snapshot().ours - alone.ours) < 32 * MiB
    finally:
        child.kill()
        child.wait()


def test_a_runner_that_ended_counts_nothing():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    device = CpuDevice()
    device.adopt(child.pid, 0)
    assert abs(device.snapshot().ours - device.allocated()) < 8 * MiB  # our own process alone


def test_on_a_simulated_gpu_a_runner_holds_what_its_engine_reported():
    device = SimulatedDevice(GiB := 2**30)
    device.adopt(4242, 600 * MiB)
    snap = device.snapshot()
    assert (snap.ours, snap.free, snap.used_by_others) == (600 * MiB, GiB - 600 * MiB, 0)
    device.release(4242)
    assert device.snapshot().free == GiB


def test_on_a_gpu_a_runner_is_ours_by_the_drivers_figure_for_its_pid_and_sees_that_card_alone():
    """A fake driver (tests/devices/test_devices.py's, which this machine needs: no GPU)
    reporting a runner's pid beside ours: the runner's bytes are the driver's, counted
    as ours and not as another program's; a child is told the card by its UUID."""
    import os

    from app.devices.cuda import CudaDevice
    from tests.devices.test_devices import FakeCudaStats, FakeNvml

    runner_pid = 4242

    class Driver(FakeNvml):
        def nvmlDeviceGetComputeRunningProcesses(self, handle: str):
            procs = [(os.getpid(), 300 * MiB), (runner_pid, 900 * MiB), (999, 500 * MiB)]
            return [type("Proc", (), {"pid": p, "usedGpuMemory": b})() for p, b in procs]

        def nvmlDeviceGetUUID(self, handle: str) -> str:
            return self.gpus[int(handle.removeprefix("gpu"))][0]

    total = 8 * 1024 * MiB
    nvml = Driver(total=total, free=total - 1700 * MiB, ours=None)
    device = CudaDevice(0, nvml=nvml, cuda=FakeCudaStats(100 * MiB, 200 * MiB))
    # the fake's cuda:0 is NVML's second card (CUDA orders fastest first): its UUID, not
    # an index a child would read through its own CUDA_VISIBLE_DEVICES
    assert device.child_visible() == "GPU-bbbb"
    assert device.process_bytes(runner_pid) == 900 * MiB
    device.adopt(runner_pid, 600 * MiB)  # its log said less: the driver's figure wins
    snap = device.snapshot()
    assert snap.ours == 300 * MiB + 900 * MiB
    assert snap.used_by_others == 500 * MiB
    device.release(runner_pid)
    assert device.snapshot().used_by_others == 500 * MiB + 900 * MiB


def test_a_runners_growth_past_its_load_figure_shrinks_the_pool_on_the_cpu():
    """A runner (a real child process) adopted at the figure its engine reported, which
    then takes 300 MiB more (a large prefill's buffers): the pool jobs may hold shrinks by
    those bytes. Counted only as ours, they would read as still free for jobs (our
    resident set grew by what the free memory lost: the pool stayed the same)."""
    from app.core.memory import MemoryView

    code = (
        "import sys; print('small', flush=True); sys.stdin.readline(); "
        f"b = bytearray({HOLD}); print('grown', flush=True); sys.stdin.readline()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "small"
        device = CpuDevice()
        device.adopt(child.pid, psutil.Process(child.pid).memory_info().rss)  # its load figure
        view = MemoryView(device, reserve=0, clock=lambda: 0.0)
        before = view.snapshot(fresh=True)
        pool_before = view.pool_bytes()
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "grown"
        after = view.snapshot(fresh=True)
        assert abs(after.runners_beyond - HOLD) < 32 * MiB  # what it holds past its figure
        assert before.runners_beyond < 32 * MiB
        # the pool lost the growth, beside what other programs took meanwhile (the
        # device's own reading of them: the machine is shared)
        others = after.used_by_others - before.used_by_others
        assert abs((pool_before - view.pool_bytes()) - others - HOLD) < 32 * MiB
    finally:
        child.kill()
        child.wait()
