"""A runner process's memory is ours: the device counts an adopted pid's memory with our
own and not as another program's (else giving memory back to other programs would evict
our own models), and forgets it when the runner ends."""

from __future__ import annotations

import subprocess
import sys

import psutil

from app.engine.device import CpuDevice, SimulatedDevice

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
