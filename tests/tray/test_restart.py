"""A restart from the tray is serving again within 10 s, twice in a row, and the tray's
own kept-alive /status connection is closed from the tray's side first: its TIME_WAIT
is then on the tray's port, never on the server's (Windows' exclusive bind refuses a
port that has connections in TIME_WAIT, for up to 240 s, and the supervisor waited for
it).

Linux does not show the old fault end to end (a server that exits under a kept
connection answers the tray's next poll with a reset, which leaves no TIME_WAIT at all;
the live test passes with the fix unwired): the unit test sees who closes first, on the
server's side of the connection, as Windows' TIME_WAIT follows it."""

from __future__ import annotations

import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import httpx
import psutil
import pytest

from tests.support.live import free_port, wait_until
from tray.monitor import Monitor
from tray.supervisor import RestartPolicy, Supervisor, server_command

# What a restart adds to a server's own start: the old one drains and exits and the new
# one is started, with no wait for the port. 3.8 s here (2 cores at a load of 10); 10 s
# is the bound. The new server's own start (a fresh interpreter importing torch
# and the app) is not the restart's: 5 s on an idle machine, 20 s at that load, so
# serving again is waited for apart, with a slow machine's margin.
RESTARTED_S = 10.0


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def time_waits_on_the_server_port(port: int, peers: set[int]) -> list[object]:
    """Connections in TIME_WAIT whose local side is the server's port and whose other
    side is one of the tray's `peers` ports: the server closed them first."""
    return [
        c
        for c in psutil.net_connections(kind="tcp4")
        if c.status == psutil.CONN_TIME_WAIT
        and c.laddr
        and c.laddr.port == port
        and c.raddr
        and c.raddr.port in peers
    ]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_restart_serves_again_within_10_s_twice_and_the_tray_closes_first(tmp_path: Path):
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(
        f'device = "simulated:1GiB"\nport = {port}\n'
        f'data_dir = "{tmp_path}/data"\nlog_dir = "{tmp_path}/log"\n'
    )
    url = f"http://127.0.0.1:{port}"
    supervisor = Supervisor(
        server_command(config),
        log_dir=tmp_path / "log",
        pid_file=tmp_path / "server.pid",
        shutdown_url=url + "/admin/shutdown",
        policy=RestartPolicy(base_s=0.2, cap_s=1),
    )
    monitor = Monitor(url, supervisor, lambda view, previous: None, interval_s=0.1)
    supervisor.before_end = monitor.end_connection  # as tray.app.Tray wires them
    supervisor.start()
    monitor.start()
    try:
        wait_until(lambda: healthy(url), 90, "the first server ready")
        took = []
        for restarts in (1, 2):
            wait_until(lambda: monitor.status._connection is not None, 10, "the kept poll")
            connection = monitor.status._connection
            assert connection is not None and connection.sock is not None
            tray_port = connection.sock.getsockname()[1]
            old = supervisor.pid
            started = time.monotonic()
            supervisor.restart()
            wait_until(lambda old=old: supervisor.pid not in (None, old), 60, "a new server")
            took.append(time.monotonic() - started)
            wait_until(lambda: healthy(url), 90, "serving again")
            # started once, the port free at once: no exit 74 and retry behind it
            assert supervisor.restarts == restarts and supervisor.last_exit != 74
            assert time_waits_on_the_server_port(port, {tray_port}) == []
        assert max(took) < RESTARTED_S, took
    finally:
        monitor.stop()
        supervisor.stop()


class KeptAlive(BaseHTTPRequestHandler):
    """Answers every poll on a kept-alive connection (503: no status document needed)
    and never closes one: a connection ends only when the client closed it, and is then
    counted."""

    protocol_version = "HTTP/1.1"
    closed_by_client: ClassVar[list[int]] = []

    def do_GET(self) -> None:
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def handle(self) -> None:
        super().handle()  # returns when the client's side reads as closed
        type(self).closed_by_client.append(self.client_address[1])

    def log_message(self, *args: Any) -> None:
        pass


def test_the_tray_closes_its_kept_connection_first_and_opens_none_to_a_server_ending():
    KeptAlive.closed_by_client = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), KeptAlive)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    supervisor = SimpleNamespace(pid=101, state="running", message="", restarts=0, failure=None)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monitor = Monitor(url, supervisor, lambda view, previous: None)  # type: ignore[arg-type]
    try:
        monitor.poll()
        monitor.poll()  # the same connection, kept
        connection = monitor.status._connection
        assert connection is not None and connection.sock is not None
        tray_port = connection.sock.getsockname()[1]
        assert KeptAlive.closed_by_client == []
        monitor.end_connection()  # what the supervisor calls before it ends its server
        wait_until(lambda: KeptAlive.closed_by_client == [tray_port], 5, "the tray's close")
        monitor.poll()  # its server is still ending: no connection to it
        assert monitor.status._connection is None
        supervisor.pid = 102  # the next server
        monitor.poll()
        assert monitor.status._connection is not None
    finally:
        monitor.status.close()
        server.shutdown()


def test_a_restart_and_a_stop_call_before_end_while_the_server_still_runs(tmp_path):
    seen: list[bool] = []
    supervisor = Supervisor(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        log_dir=tmp_path / "log",
        pid_file=tmp_path / "pid",
        policy=RestartPolicy(base_s=0.05, cap_s=0.2),
        drain_s=5,
    )
    supervisor.before_end = lambda: seen.append(supervisor._child.poll() is None)
    supervisor.start()
    try:
        wait_until(lambda: supervisor.state == "running", 10, "running")
        first = supervisor.pid
        supervisor.restart()
        wait_until(lambda: supervisor.pid not in (None, first), 20, "restarted")
    finally:
        supervisor.stop()
    assert seen == [True, True]
