"""The supervisor with real child processes, and its restart policy as a table."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import psutil
import pytest

from app.errors import EXIT_FATAL_DEVICE, EXIT_INVALID_SETTINGS, EXIT_PORT_IN_USE
from tests.support.live import free_port, wait_until
from tray.supervisor import OUTPUT_LOG, RestartPolicy, Supervisor, server_command

# (exit code, uptime) sequence -> (restart?, delay) of the last decision
POLICY_TABLE = [
    pytest.param([(1, 0.5)], (True, 1.0), id="first crash waits the base delay"),
    pytest.param([(1, 20), (1, 20), (1, 20)], (True, 4.0), id="backoff doubles"),
    pytest.param([(1, 20)] * 9, (True, 30.0), id="backoff is capped"),
    pytest.param([(1, 20)] * 5 + [(1, 120)], (True, 1.0), id="a healthy run resets it"),
    pytest.param([(1, 0.5)] * 5, (False, 0), id="repeated fast crashes give up"),
    pytest.param([(EXIT_FATAL_DEVICE, 30)], (True, 0.0), id="fatal device error restarts now"),
    pytest.param([(EXIT_PORT_IN_USE, 0.5)], (False, 0), id="a first start on a taken port"),
    pytest.param([(EXIT_INVALID_SETTINGS, 0.5)], (False, 0), id="invalid settings neither"),
]


@pytest.mark.parametrize(("exits", "expected"), POLICY_TABLE)
def test_restart_policy_table(exits, expected):
    policy = RestartPolicy()
    decision = None
    for code, uptime in exits:
        decision = policy.decide(code, uptime)
    assert (decision.restart, decision.delay_s) == expected
    assert decision.reason


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


TAKEN = (EXIT_PORT_IN_USE, 0.5)
ENDED = ("ended",)  # a restart the person asked for: our server let go of the port
# Steps: an exit (code, uptime), ENDED, or ("wait", seconds) -> the last decision.
PORT_TABLE = [
    pytest.param([TAKEN], (False, 0, "another program"), id="first start: another program"),
    pytest.param([(1, 20), TAKEN], (True, 1.0, "trying again"), id="after our crash: retried"),
    pytest.param([ENDED, TAKEN], (True, 1.0, "trying again"), id="after a requested restart"),
    pytest.param([ENDED, TAKEN, TAKEN, TAKEN], (True, 4.0, "3 of 10"), id="with backoff"),
    pytest.param([ENDED] + [TAKEN] * 6, (True, 30.0, "6 of 10"), id="capped"),
    pytest.param([ENDED] + [TAKEN] * 11, (False, 0, "another program"), id="bounded in count"),
    pytest.param([ENDED, ("wait", 300), TAKEN], (False, 0, "another program"), id="and in time"),
    pytest.param([ENDED] + [TAKEN] * 5 + [(1, 120), TAKEN], (True, 1.0, "1 of 10"), id="reset"),
    pytest.param([ENDED] + [TAKEN] * 4 + [(1, 0.5)], (True, 1.0, "code 1"), id="not fast crashes"),
]


@pytest.mark.parametrize(("steps", "expected"), PORT_TABLE)
def test_port_in_use_after_our_own_server_is_retried_a_bounded_number_of_times(steps, expected):
    """Issue 29, 15: a restarted server may find the port still held by what its
    predecessor left (connections in TIME_WAIT, which Windows' exclusive bind may refuse
    for minutes). That is retried, with backoff, a bounded number of times and for a
    bounded time; a first start that finds the port taken says another program has it."""
    clock = Clock()
    policy = RestartPolicy(clock=clock)
    decision = None
    for step in steps:
        if step == ENDED:
            policy.server_ended()
        elif step[0] == "wait":
            clock.now += step[1]
        else:
            decision = policy.decide(*step)
            clock.now += step[1] + (decision.delay_s if decision.restart else 0)
    restart, delay, words = expected
    assert (decision.restart, decision.delay_s) == (restart, delay), decision
    assert words in decision.reason


def child(script: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(script)]


SLEEPER = child("""
    import signal, sys, time
    signal.signal(signal.SIGTERM, lambda *a: (print("draining", flush=True), sys.exit(0)))
    print("child up", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def supervise(tmp_path):
    started: list[Supervisor] = []

    def make(command, **kwargs) -> Supervisor:
        policy = kwargs.pop("policy", RestartPolicy(base_s=0.05, cap_s=0.2))
        sup = Supervisor(
            command,
            log_dir=tmp_path / "log",
            pid_file=tmp_path / "server.pid",
            policy=policy,
            **kwargs,
        )
        sup.start()
        started.append(sup)
        return sup

    yield make
    for sup in started:
        sup.stop()


def test_a_killed_child_is_brought_back(supervise, tmp_path):
    sup = supervise(SLEEPER)
    wait_until(lambda: sup.state == "running" and sup.pid, 10, "first child")
    first = sup.pid
    assert (tmp_path / "server.pid").read_text() == str(first)
    subprocess.run(["kill", "-9", str(first)], check=True)
    wait_until(lambda: sup.pid not in (None, first) and sup.state == "running", 10, "restart")
    assert sup.restarts == 1 and sup.last_exit == -9
    assert (tmp_path / "server.pid").read_text() == str(sup.pid)


def test_port_in_use_is_not_a_restart_loop(supervise):
    sup = supervise(child(f"import sys; sys.exit({EXIT_PORT_IN_USE})"))
    wait_until(lambda: sup.state == "gave_up", 10, "gave up")
    time.sleep(0.3)
    assert sup.restarts == 0 and "port" in sup.message


@pytest.mark.slow  # ~15-30 s
def test_a_restarted_server_that_finds_its_port_held_is_tried_again(supervise, tmp_path):
    """A real server is killed; something holds its port while the next one starts
    (as a lingering TIME_WAIT can on Windows): that one exits 74, the supervisor tries
    again after a backoff, and once the port is free the server serves again."""
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(
        f'device = "simulated:1GiB"\nport = {port}\n'
        f'data_dir = "{tmp_path}/data"\nlog_dir = "{tmp_path}/log"\n'
    )
    url = f"http://127.0.0.1:{port}"
    sup = supervise(server_command(config), policy=RestartPolicy(base_s=0.5, cap_s=1))
    wait_until(lambda: healthy(url), 90, "first server ready")
    holder = socket.socket()
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        os.kill(sup.pid, signal.SIGKILL)
        wait_until(lambda: not healthy(url), 10, "server gone")
        holder.bind(("127.0.0.1", port))
        holder.listen()
        wait_until(lambda: sup.last_exit == EXIT_PORT_IN_USE and sup.state != "running", 60, "74")
        assert sup.state == "restarting", sup.message
    finally:
        holder.close()
    wait_until(lambda: healthy(url), 90, "the server back once the port is free")
    assert sup.state == "running"


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_repeated_fast_crashes_give_up_and_say_so(supervise):
    sup = supervise(child("import sys; sys.exit(3)"))
    wait_until(lambda: sup.state == "gave_up", 20, "gave up")
    assert sup.restarts == 4 and "crashed 5 times" in sup.message


def test_fatal_device_exit_restarts_at_once(supervise):
    sup = supervise(
        child(f"import sys, time; time.sleep(0.2); sys.exit({EXIT_FATAL_DEVICE})"),
        policy=RestartPolicy(base_s=60, max_fast=100),
    )
    wait_until(lambda: sup.restarts >= 2, 10, "two immediate restarts despite a 60 s base")


def test_stop_drains_the_child_and_cleans_up(supervise, tmp_path):
    sup = supervise(SLEEPER)
    wait_until(lambda: sup.state == "running", 10, "running")
    wait_until(lambda: "child up" in (tmp_path / "log" / OUTPUT_LOG).read_text(), 10, "output")
    assert sup.stop() == 0
    assert sup.state == "stopped" and not (tmp_path / "server.pid").exists()
    assert "draining" in (tmp_path / "log" / OUTPUT_LOG).read_text()


def test_stop_kills_a_child_that_will_not_drain(supervise):
    stubborn = child("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)
    """)
    sup = supervise(stubborn, drain_s=0.5)
    wait_until(lambda: sup.state == "running", 10, "running")
    time.sleep(0.3)  # let the child install its handler
    assert sup.stop() == -9


def test_restart_kills_a_child_that_hears_neither_signals_nor_http(supervise, tmp_path):
    """As a Windows child without a console hears no console event: the restart asks,
    waits the drain bound, then kills, and a fresh child starts."""
    deaf = child("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("deaf child up", flush=True)
        time.sleep(600)
    """)
    unanswered = "http://127.0.0.1:9/admin/shutdown"  # nothing listens: the HTTP ask fails
    sup = supervise(deaf, drain_s=0.5, shutdown_url=unanswered, policy=RestartPolicy(base_s=60))
    wait_until(lambda: sup.state == "running", 10, "running")
    wait_until(lambda: "deaf" in (tmp_path / "log" / OUTPUT_LOG).read_text(), 10, "handlers set")
    first = sup.pid
    sup.restart()
    wait_until(lambda: sup.pid != first and sup.state == "running", 10, "restarted")
    assert sup.last_exit == -9 and sup.policy.failures == 0


def test_requested_restart_is_not_a_crash(supervise):
    sup = supervise(SLEEPER, policy=RestartPolicy(base_s=60))
    wait_until(lambda: sup.state == "running", 10, "running")
    first = sup.pid
    sup.restart()
    wait_until(lambda: sup.pid != first and sup.state == "running", 10, "restarted at once")
    assert sup.policy.failures == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_child_dies_with_a_killed_tray(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tray.supervisor import Supervisor
        sup = Supervisor({SLEEPER!r}, log_dir=Path({str(tmp_path)!r}),
                         pid_file=Path({str(tmp_path / "pid")!r}))
        sup.start()
        time.sleep(600)
    """)
    tray = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_until(
            lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text(),
            10,
            "child started",
        )
        child_pid = int((tmp_path / "pid").read_text())
        wait_until(lambda: "child up" in (tmp_path / OUTPUT_LOG).read_text(), 10, "child up")
    finally:
        tray.kill()
        tray.wait()

    def gone() -> bool:
        try:
            state = Path(f"/proc/{child_pid}/stat").read_text().split()[2]
        except FileNotFoundError:
            return True
        return state == "Z"

    wait_until(gone, 10, "child ended with its parent")


def test_the_bundles_server_child_is_its_console_executable(tmp_path):
    """A windowed child has no stdout: the tray runs `vramgate-cli serve` where the
    bundle has it (without a window: CREATE_NO_WINDOW), so its output reaches the log."""
    from tray.supervisor import server_command

    windowed = tmp_path / "vramgate.exe"
    windowed.touch()
    alone = server_command(None, str(windowed), frozen=True)
    assert alone == [str(windowed), "serve"]
    (tmp_path / "vramgate-cli.exe").touch()
    config = tmp_path / "config.toml"
    assert server_command(config, str(windowed), frozen=True) == [
        str(tmp_path / "vramgate-cli.exe"), "serve", "--config", str(config)
    ]  # fmt: skip
    assert server_command(None, "/venv/bin/python", frozen=False)[1:] == ["-m", "app", "serve"]


TRAY_STAND_IN = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tray.supervisor import Supervisor, server_command
    config, log = Path(sys.argv[1]), Path(sys.argv[2])
    Supervisor(server_command(config), log_dir=log, pid_file=log / "server.pid").start()
    time.sleep(600)
""")


def _gguf_config(tmp_path: Path, gguf: Path) -> tuple[Path, str]:
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(
        f'port = {port}\ndevice = "cpu"\ndata_dir = "{(tmp_path / "d").as_posix()}"\n'
        f'log_dir = "{(tmp_path / "l").as_posix()}"\n'
        f'[[models]]\nname = "smol"\nkind = "generation"\npath = "{gguf.as_posix()}"\n'
        'context_length = 2048\nload = "startup"\n'
    )
    return config, f"http://127.0.0.1:{port}"


def _runner_pid(url: str) -> int | None:
    try:
        models = httpx.get(url + "/status", timeout=5).json()["models"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None
    return next((m.get("runner_pid") for m in models if m["name"] == "smol"), None)


def _gone(*processes: psutil.Process) -> bool:
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes)


@pytest.mark.skipif(sys.platform != "win32", reason="the job objects are Windows'")
def test_killing_the_tray_ends_its_server_and_the_servers_runner(tmp_path, smollm2_gguf):
    """Windows CI (issue 41, 6): the tray's supervisor, in a process of its own as in
    the tray (without the icon, which needs a notification area), runs a server that
    loads a GGUF model in a runner; the tray process is killed (TerminateProcess, no
    chance to clean up) and the server and its runner end with it: the server was held
    by the tray's kill-on-close job from its first instruction, the runner born in it.
    Whatever exit codes Windows gives them (none is documented), they are gone."""
    config, url = _gguf_config(tmp_path, smollm2_gguf)
    log = tmp_path / "tray-log"
    tray = subprocess.Popen([sys.executable, "-c", TRAY_STAND_IN, str(config), str(log)])
    try:
        wait_until(lambda: _runner_pid(url) is not None, 300, "the model loaded in its runner")
        server = psutil.Process(int((log / "server.pid").read_text()))
        runner = psutil.Process(_runner_pid(url))
        tray.kill()
        tray.wait(30)
        wait_until(lambda: _gone(server, runner), 30, "the server and its runner gone")
    finally:
        if tray.poll() is None:
            tray.kill()


@pytest.mark.skipif(sys.platform != "win32", reason="the job objects are Windows'")
def test_a_headless_server_killed_takes_its_runner_with_it(tmp_path, smollm2_gguf):
    """`vramgate serve` without the tray holds its runners in a job of its own: killed,
    its runner ends. Windows' os.getppid never changes, so the runner's watch of its
    parent cannot see it go; the end of its stdin pipe may, where no other process holds
    that pipe's handle; the job ends it in any case."""
    config, url = _gguf_config(tmp_path, smollm2_gguf)
    server = subprocess.Popen([sys.executable, "-m", "app", "serve", "--config", str(config)])
    try:
        wait_until(lambda: _runner_pid(url) is not None, 300, "the model loaded in its runner")
        runner = psutil.Process(_runner_pid(url))
        server.kill()
        server.wait(30)
        wait_until(lambda: _gone(runner), 30, "the runner gone")
    finally:
        if server.poll() is None:
            server.kill()
