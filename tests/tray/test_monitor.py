"""The monitor polls a live server and reports only changes."""

from __future__ import annotations

import contextlib
import sys
import time

import pytest

from app.config.settings import ModelSpec, SimulatedBucket
from tests.support.live import free_port
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
    assert len(seen) == 2 and changed.icon.vram_fraction == pytest.approx(0.5, abs=0.5 / 51)


def test_monitor_without_a_server_shows_starting(tmp_path):
    supervisor = Supervisor(["true"], log_dir=tmp_path, pid_file=tmp_path / "pid")
    view = Monitor(f"http://127.0.0.1:{free_port()}", supervisor, lambda *a: None).poll()
    assert view.icon.state == "starting" and view.tooltip == "vramgate: starting"


def time_wait_on(port: int) -> int:
    """Connections in TIME_WAIT whose local end is `port` (Linux's /proc/net/tcp): what
    an actively closing server leaves behind on its own port."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as rows:
            for row in list(rows)[1:]:
                local, state = row.split()[1], row.split()[3]
                count += state == "06" and int(local.rsplit(":", 1)[1], 16) == port
    return count


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/tcp")
def test_polling_leaves_no_time_wait_on_the_servers_port(server_factory, tmp_path):
    """Issue 29, 15: a poll that asks the server to close (`Connection: close`) makes the
    server the side that closes, and every poll left a TIME_WAIT on the server's port,
    where a restarted server binds (Windows may refuse the exclusive bind over them).
    The monitor keeps one connection open and reuses it."""
    live = server_factory(device="simulated:1GiB", models=(SIM,))
    port = int(live.url.rsplit(":", 1)[1])
    supervisor = Supervisor(["true"], log_dir=tmp_path, pid_file=tmp_path / "pid")
    supervisor.state = "running"
    monitor = Monitor(live.url, supervisor, lambda view, previous: None)
    before = time_wait_on(port)
    for _ in range(5):
        assert monitor.poll().icon.state == "ready"
    time.sleep(0.2)  # a close the server started is in TIME_WAIT by now
    assert time_wait_on(port) - before == 0


def test_monitor_sends_the_token_on_its_kept_connection(server_factory, tmp_path):
    live = server_factory(device="simulated:1GiB", models=(SIM,), token="tray-secret")
    supervisor = Supervisor(["true"], log_dir=tmp_path, pid_file=tmp_path / "pid")
    supervisor.state = "running"
    monitor = Monitor(live.url, supervisor, lambda *a: None, token=lambda: "tray-secret")
    assert [monitor.poll().icon.state for _ in range(3)] == ["ready"] * 3
    anonymous = Monitor(live.url, supervisor, lambda *a: None)
    assert anonymous.poll().icon.state == "starting"  # 401: no figures without the token
