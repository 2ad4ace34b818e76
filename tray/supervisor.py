"""The supervisor: runs `vramgate serve` as a child process and keeps it running.

Crash-only: whatever kills the server (a crash, a fatal CUDA error that poisoned the
context, the user's task manager), a fresh one starts, after a capped exponential
backoff that resets once a child has run healthily for a while. Repeated fast crashes
end in giving up, said in the tray; invalid settings are never retried (a restart cannot
fix them), nor is a port that another program holds. A port still held just after a
server of ours ended is retried, with backoff and within bounds: what the old server
left on it (connections in TIME_WAIT) may refuse Windows' exclusive bind for a while.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import logging.handlers
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from app.errors import EXIT_FATAL_DEVICE, EXIT_INVALID_SETTINGS, EXIT_PORT_IN_USE, EXIT_WEDGED
from app.process.job_object import KillOnClose
from tray.start_failures import StartFailure, diagnose

log = logging.getLogger("vramgate.tray.supervisor")
OUTPUT_LOG = "server-output.log"
CONSOLE_EXE = "vramgate-cli"  # the bundle's console executable (app.spec)
TAIL_LINES = 200  # a child's last output lines, read for a known start failure
OUTPUT_CATCH_UP_S = 2.0  # its last lines may still be in the pipe when it has exited


@dataclass(frozen=True)
class RestartDecision:
    restart: bool
    delay_s: float
    reason: str


class RestartPolicy:
    """When to start the server again after it exited. Pure; the uptime is passed in."""

    def __init__(
        self,
        *,
        base_s: float = 1.0,
        cap_s: float = 30.0,
        healthy_s: float = 60.0,
        fast_s: float = 10.0,
        max_fast: int = 5,
        port_retries: int = 10,
        port_wait_s: float = 240.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_s, self.cap_s = base_s, cap_s
        self.healthy_s, self.fast_s, self.max_fast = healthy_s, fast_s, max_fast
        # Windows keeps a closed connection in TIME_WAIT for up to 240 s by default
        # (TcpTimedWaitDelay); past that, or past the retries, another program has it.
        self.port_retries, self.port_wait_s = port_retries, port_wait_s
        self.clock = clock
        self.failures = 0  # exits since the last healthy run
        self.fast = 0  # consecutive exits soon after starting
        self.ended_at: float | None = None  # when a server of ours last let go of the port
        self.port_tries = 0  # exits 74 since then

    def server_ended(self) -> None:
        """A server of ours held the port until now (it exited, or a restart the person
        asked for ended it)."""
        self.ended_at, self.port_tries = self.clock(), 0

    def decide(self, exit_code: int, uptime_s: float) -> RestartDecision:
        if exit_code == EXIT_PORT_IN_USE:
            return self._port_taken()
        if exit_code == EXIT_INVALID_SETTINGS:
            return RestartDecision(False, 0, "the settings are invalid (see the log)")
        self.server_ended()
        if uptime_s >= self.healthy_s:
            self.failures = self.fast = 0
        self.failures += 1
        self.fast = self.fast + 1 if uptime_s < self.fast_s else 0
        if self.fast >= self.max_fast:
            return RestartDecision(
                False, 0, f"the server crashed {self.fast} times within {self.fast_s:g}s of start"
            )
        if exit_code == EXIT_FATAL_DEVICE:
            return RestartDecision(True, 0, "fatal device error; restarting with a fresh context")
        if exit_code == EXIT_WEDGED:
            return RestartDecision(True, 0, "an inference thread wedged; restarting")
        delay = min(self.cap_s, self.base_s * 2 ** (self.failures - 1))
        return RestartDecision(True, delay, f"the server exited with code {exit_code}")

    def _port_taken(self) -> RestartDecision:
        if self.ended_at is None:
            return RestartDecision(False, 0, "the port is in use by another program")
        waited = self.clock() - self.ended_at
        if self.port_tries >= self.port_retries or waited >= self.port_wait_s:
            return RestartDecision(
                False, 0, f"the port is in use by another program ({waited:.0f}s after ours)"
            )
        self.port_tries += 1
        delay = min(self.cap_s, self.base_s * 2 ** (self.port_tries - 1))
        return RestartDecision(
            True,
            delay,
            f"the port is not free yet; trying again ({self.port_tries} of {self.port_retries})",
        )


def server_command(
    config_file: Path | None = None,
    executable: str = sys.executable,
    frozen: bool = getattr(sys, "frozen", False),
) -> list[str]:
    """The child's command line. In the bundle: its console executable, `vramgate-cli`,
    beside the windowed one (run without a window, its output reaches the server log;
    a windowed child would have none), or the same executable where there is none."""
    if frozen:
        here = Path(executable)
        console = here.with_name(CONSOLE_EXE + here.suffix)
        command = [str(console) if console.is_file() else executable, "serve"]
    else:
        command = [executable, "-m", "app", "serve"]
    return [*command, "--config", str(config_file)] if config_file else command


class Supervisor:
    """Owns the child process. Its state is read by the tray's monitor thread."""

    def __init__(
        self,
        command: list[str],
        *,
        log_dir: Path,
        pid_file: Path,
        policy: RestartPolicy | None = None,
        drain_s: float = 20.0,
        shutdown_url: str | None = None,
        on_change: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        before_end: Callable[[], None] = lambda: None,
    ) -> None:
        self.command = command
        # called before a restart or stop ends the server (the tray closes its own
        # connections to it: tray.monitor.Monitor.end_connection)
        self.before_end = before_end
        self.shutdown_url = shutdown_url  # POST here asks the server to drain and exit
        self.pid_file = pid_file
        self.policy = policy or RestartPolicy()
        self.drain_s = drain_s
        self.on_change = on_change
        self.clock = clock
        self.state = "starting"  # starting | running | restarting | gave_up | stopped
        self.message = ""
        self.restarts = 0
        self.last_exit: int | None = None
        self.failure: StartFailure | None = None  # a known cause read from its output
        self._lock = threading.Lock()  # guards _child and the _stopping/_restart flags
        self._child: subprocess.Popen[str] | None = None
        self._stopping = False
        self._restart_requested = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._output = _rotating_logger(log_dir / OUTPUT_LOG)
        self._job: KillOnClose | None = None  # Windows: the job object the child runs in
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._reader: threading.Thread | None = None  # copies the child's output

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.pid if child is not None else None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)
        self._thread.start()

    def restart(self) -> None:
        """Stop the child gracefully (killed past the drain bound, in the background); a
        fresh one starts once it is gone (not counted as a crash)."""
        with self._lock:
            self._restart_requested = True
            child = self._child
        self.before_end()
        if child is not None:
            threading.Thread(target=self._end, args=(child,), name="restart", daemon=True).start()
        self._wake.set()

    def stop(self, drain_s: float | None = None) -> int | None:
        """Drain and stop the child: it stops accepting, running jobs finish within the
        drain bound (`drain_s`, or the supervisor's), then it exits; killed if it does
        not. Returns its exit code."""
        if drain_s is not None:
            self.drain_s = min(self.drain_s, drain_s)
        with self._lock:
            self._stopping = True
            child = self._child
        self._wake.set()
        self.before_end()
        code = self._end(child) if child is not None else None
        if self._thread is not None:
            self._thread.join(10)
        self._set("stopped", "")
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()
        return code

    # -- the loop -----------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping:
            started = self.clock()
            child = self._spawn()
            if child is None:
                return
            code = child.wait()
            uptime = self.clock() - started
            self.last_exit = code
            if self._reader is not None:
                self._reader.join(OUTPUT_CATCH_UP_S)
            self.failure = diagnose(self._tail)
            with self._lock:
                if self._stopping:
                    return
                requested, self._restart_requested = self._restart_requested, False
            if requested:
                self.policy.server_ended()
                self.restarts += 1
                self._set("restarting", "restart requested")
                continue
            decision = self.policy.decide(code, uptime)
            log.warning("server exited with code %d after %.1fs: %s", code, uptime, decision.reason)
            if self.failure is not None:
                log.warning("its output says why: %s", self.failure.text())
            if not decision.restart:
                self._set("gave_up", decision.reason)
                return
            self.restarts += 1
            self._set("restarting", decision.reason)
            self._wake.wait(decision.delay_s)
            self._wake.clear()

    def _spawn(self) -> subprocess.Popen[str] | None:
        flags = 0
        if sys.platform == "win32":  # no console; its own group: a Ctrl+C is the tray's
            flags = subprocess.CREATE_NEW_PROCESS_GROUP | subprocess.CREATE_NO_WINDOW
        popen: dict[str, Any] = dict(
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            creationflags=flags,
            preexec_fn=_die_with_parent(),
        )
        with self._lock:
            if self._stopping:
                return None
            job = self._windows_job()
            # in the job from its first instruction, and so are the runners it starts
            child = (
                job.spawn(self.command, **popen) if job else subprocess.Popen(self.command, **popen)
            )
            self._child = child
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.write_text(str(child.pid))
        self._tail = collections.deque(maxlen=TAIL_LINES)  # this child's own
        self.failure = None
        self._reader = threading.Thread(
            target=self._copy_output, args=(child.stdout, self._tail), daemon=True
        )
        self._reader.start()
        log.info("server started (pid %d): %s", child.pid, " ".join(self.command))
        self._set("running", "")
        return child

    def _windows_job(self) -> KillOnClose | None:
        """Windows: the job the server runs in and dies with, however the tray ends."""
        if sys.platform != "win32":
            return None
        if self._job is None:
            try:
                self._job = KillOnClose()
            except OSError as exc:
                log.warning("the server will not end with the tray: job object: %s", exc)
        return self._job

    def _copy_output(self, stream: IO[str] | None, tail: collections.deque[str]) -> None:
        if stream is None:
            return
        for line in stream:
            self._output.info(line.rstrip("\n"))
            tail.append(line)

    def _end(self, child: subprocess.Popen[str]) -> int | None:
        """Stop the child the way it can hear: the HTTP shutdown route (with the token:
        the tray's client sends it), else a signal (POSIX) or termination (Windows, where
        a child without a console gets no console events); killed if it has not exited
        within the drain bound. Returns its exit code."""
        if child.poll() is not None:
            return child.returncode
        if not (self.shutdown_url and _post(self.shutdown_url)):
            with contextlib.suppress(OSError):
                if sys.platform == "win32":
                    child.terminate()
                else:
                    child.send_signal(signal.SIGTERM)
        try:
            return child.wait(self.drain_s)
        except subprocess.TimeoutExpired:
            log.warning("server did not stop within %.0fs; killing it", self.drain_s)
            child.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                return child.wait(10)
            return None

    def _set(self, state: str, message: str) -> None:
        self.state, self.message = state, message
        self.on_change()


def _post(url: str) -> bool:
    request = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=3):
            return True
    except (urllib.error.URLError, OSError):
        return False


def _die_with_parent() -> Callable[[], None] | None:
    """Linux: the child gets SIGTERM if the tray dies, even by SIGKILL, so a server is
    never left behind (Windows: the job object, `KillOnClose`)."""
    if not sys.platform.startswith("linux"):
        return None

    def set_death_signal() -> None:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM))

    return set_death_signal


def _rotating_logger(path: Path) -> logging.Logger:
    path.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger(f"vramgate.child.{os.getpid()}.{id(path)}")
    logger.propagate = False
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=10 * 2**20, backupCount=3, encoding="utf-8"
    )
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return logger
