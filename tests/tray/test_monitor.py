"""The monitor polls a live server and reports only changes."""

from __future__ import annotations

from app.settings import ModelSpec, SimulatedBucket
from tests.live import free_port
from tray.monitor import Monitor
from tray.supervisor import Supervisor

MiB = 2**20
SIM = ModelSpec(
    name="sim", kind="simulated", buckets=(SimulatedBucket(size=16, bytes=10 * MiB, run_ms=1),)
)


def test_monitor_hands_over_a_view_only_when_it_changes(server_factory, tmp_path):
    live = server_factory(device="simulated:1GiB", models=(SIM,))
    supervisor = Supervisor(["true"], log_dir=tmp_path, pid_file=tmp_path / "pid")
    supervisor.state = "running"  # the server is run by the test, not by this supervisor
    seen = []
    monitor = Monitor(live.url, supervisor, lambda view, previous: seen.append(view))
    first = monitor.poll()
    monitor.poll()
    assert seen == [first]
    assert first.icon.state == "ready" and first.tooltip.startswith("VRAM 0.0 / 1.0 GiB")
    live.service.device.set_external(512 * MiB)
    live.service.memory.snapshot(fresh=True)
    changed = monitor.poll()
    assert len(seen) == 2 and changed.icon.vram_fraction == 0.5


def test_monitor_without_a_server_shows_starting(tmp_path):
    supervisor = Supervisor(["true"], log_dir=tmp_path, pid_file=tmp_path / "pid")
    view = Monitor(f"http://127.0.0.1:{free_port()}", supervisor, lambda *a: None).poll()
    assert view.icon.state == "starting" and view.tooltip == "vramgate: starting"
