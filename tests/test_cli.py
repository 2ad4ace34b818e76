"""The `vramgate` command as a user runs it: real processes on loopback."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.config.settings import Settings
from app.errors import EXIT_FATAL_DEVICE, EXIT_INVALID_SETTINGS, EXIT_PORT_IN_USE
from tests.support.live import ServerProcess, clean_env, free_port


def vramgate(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        **kwargs,
    )


SIM_CONFIG = """
device = "simulated:1GiB"
[[models]]
name = "sim"
kind = "simulated"
buckets = [{{size = 16, bytes = "100MiB", run_ms = 5}}, {{size = 64, bytes = "2GiB", run_ms = 5}}]
inject = {{oom_on_calls = [{oom}], fatal_on_calls = [{fatal}]}}
"""


def sim_process(tmp_path: Path, *, oom: int = 0, fatal: int = 0) -> ServerProcess:
    config = tmp_path / "config.toml"
    config.write_text(SIM_CONFIG.format(oom=oom, fatal=fatal))
    server = ServerProcess(
        [
            sys.executable,
            "-m",
            "app",
            "serve",
            "--config",
            str(config),
            "--data-dir",
            str(tmp_path / "data"),
            "--log-dir",
            str(tmp_path / "log"),
        ]
    )
    server.log_dir = tmp_path / "log"
    return server


@pytest.fixture
def sim_server(tmp_path):
    servers: list[ServerProcess] = []

    def start(**kwargs) -> ServerProcess:
        server = sim_process(tmp_path, **kwargs)
        servers.append(server)
        server.wait_ready()
        return server

    yield start
    for server in servers:
        server.stop()


def test_help_documents_every_setting():
    out = vramgate("serve", "--help").stdout
    for name in Settings.model_fields:
        flag = "--model" if name == "models" else "--" + name.replace("_", "-")
        assert flag in out, flag
        assert f"VRAMGATE_{name.upper()}" in out


def test_invalid_setting_is_refused_clearly():
    result = vramgate("serve", "--device", "gpu0")
    assert result.returncode == 2
    assert "device" in result.stderr


def test_status_prints_a_running_server(sim_server):
    server = sim_server()
    httpx.post(server.url + "/v1/embeddings", json={"model": "sim", "input": "hello"})
    text = vramgate("status", "--url", server.url)
    assert text.returncode == 0
    assert "ready" in text.stdout and "model    sim" in text.stdout and "w16" in text.stdout
    raw = json.loads(vramgate("status", "--url", server.url, "--json").stdout)
    assert raw["counters"]["served_by_model"]["sim"] >= 1


def test_status_of_no_server_says_so():
    result = vramgate("status", "--url", f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 1 and "not answering" in result.stderr


def test_port_in_use_is_reported_not_crashed(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = vramgate(
            "serve",
            "--port",
            str(port),
            "--log-dir",
            str(tmp_path),
            "--device",
            "simulated:1GiB",
            "--model",
            "sim=simulated",
        )
    assert result.returncode == EXIT_PORT_IN_USE
    assert "already in use" in result.stderr


def test_a_cuda_device_that_cannot_be_had_exits_2_not_a_crash_to_retry(tmp_path):
    """The supervisor restarts a server that exits 1; a settings error (2) it does not.
    This machine has no NVIDIA driver; on one with a GPU, cuda:63 does not exist."""
    result = vramgate(
        "serve",
        "--port",
        str(free_port()),
        "--log-dir",
        str(tmp_path),
        "--data-dir",
        str(tmp_path),
        "--device",
        "cuda:63",
    )
    assert result.returncode == EXIT_INVALID_SETTINGS
    assert "cuda:63" in result.stderr and "Traceback" not in result.stderr


def test_fatal_device_error_exits_with_its_code(sim_server):
    server = sim_server(fatal=3)  # two warm-up calls, then the first request
    response = httpx.post(server.url + "/v1/embeddings", json={"model": "sim", "input": "x"})
    assert response.status_code == 503
    assert server.process.wait(30) == EXIT_FATAL_DEVICE
    log = (server.log_dir / "server.log").read_text()
    assert "fatal device error" in log


def test_log_has_a_line_per_request_and_a_device_snapshot_on_warnings(sim_server):
    server = sim_server(oom=4)  # the second request runs out of memory
    for _ in range(3):
        httpx.post(server.url + "/v1/embeddings", json={"model": "sim", "input": "x"})
    assert server.stop(signal.SIGTERM) == 0
    log = (server.log_dir / "server.log").read_text()
    assert "request model=sim bucket=w16 price=104857600 " in log
    assert "outcome=ok" in log and "outcome=out_of_memory" in log
    warning = next(
        line for line in log.splitlines() if "WARNING" in line and "out of memory" in line
    )
    assert "[device: total=1024MiB" in warning
    assert "vramgate stopped (exit code 0)" in log


def test_a_forged_forwarded_address_does_not_change_who_the_server_sees(sim_server):
    server = sim_server()
    # Loopback is who we are; a header claiming otherwise is ignored, not trusted.
    response = httpx.post(server.url + "/admin/pause", headers={"X-Forwarded-For": "203.0.113.9"})
    assert response.status_code == 200
    httpx.post(server.url + "/admin/resume")


def test_an_auto_token_is_kept_across_restarts(tmp_path):
    """`token = "auto"` is handed to LAN clients once; a restart (the tray restarts a
    crashed server) keeps it, so they go on working."""
    data = tmp_path / "d"
    argv = [
        sys.executable, "-m", "app", "serve", "--token", "auto", "--device", "simulated:1GiB",
        "--model", "sim=simulated", "--data-dir", str(data), "--log-dir", str(tmp_path / "l"),
    ]  # fmt: skip
    given: str | None = None
    for _ in range(2):
        server = ServerProcess(argv)
        try:
            server.wait_ready(120)
            given = given or (data / "token").read_text().strip()
            mine = {"Authorization": f"Bearer {given}"}
            assert httpx.get(server.url + "/status", headers=mine).status_code == 200
        finally:
            assert server.stop() == 0
    assert (data / "token").read_text().strip() == given
    if sys.platform != "win32":
        assert (data / "token").stat().st_mode & 0o777 == 0o600
