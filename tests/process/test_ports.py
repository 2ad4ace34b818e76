"""The port probe (app.process.ports), which the tray and `serve` both ask before starting."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from app.process.ports import (
    WINDOWS_SO_EXCLUSIVEADDRUSE,
    WINDOWS_SO_REUSEADDR,
    port_free,
    probe_options,
)
from tests.support.live import ServerProcess, free_port


def test_a_port_with_a_live_listener_is_not_free_and_a_closed_one_is():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert not port_free("127.0.0.1", port)
    assert port_free("127.0.0.1", port)


def test_on_windows_the_probe_binds_exclusively_and_never_with_reuseaddr():
    """SO_REUSEADDR on Windows lets a socket bind over a live listener: the probe would
    call a port in use free, uvicorn would then fail, and the tray would count crashes."""
    options = [option for option, _ in probe_options("win32")]
    assert options == [WINDOWS_SO_EXCLUSIVEADDRUSE] and WINDOWS_SO_REUSEADDR not in options
    assert WINDOWS_SO_EXCLUSIVEADDRUSE == -5  # ~4, as winsock2.h defines it


@pytest.mark.skipif(sys.platform != "win32", reason="Windows' own socket constants")
def test_windows_constants_are_the_socket_modules():
    assert socket.SO_REUSEADDR == WINDOWS_SO_REUSEADDR
    assert socket.SO_EXCLUSIVEADDRUSE == WINDOWS_SO_EXCLUSIVEADDRUSE  # type: ignore[attr-defined]


O_CLOEXEC = 0o2000000  # Linux fcntl.h, as /proc/PID/fdinfo's `flags` shows it


def _listening_sockets_of(pid: int) -> dict[int, tuple[socket.socket, int]]:
    """Linux: each TCP listening socket of process `pid` by port, duplicated into this
    process (pidfd_getfd(2), syscall 438 on every architecture), with its fd flags in
    `pid` (the duplicate has flags of its own)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    found: dict[int, tuple[socket.socket, int]] = {}
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
                fdinfo = Path(f"/proc/{pid}/fdinfo/{name}").read_text()
            except OSError:
                continue  # closed meanwhile
            copy = libc.syscall(438, pidfd, int(name), 0)
            assert copy >= 0, f"pidfd_getfd: errno {ctypes.get_errno()}"
            sock = socket.socket(fileno=copy)
            if sock.type == socket.SOCK_STREAM and sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_ACCEPTCONN
            ):
                flags = int(fdinfo.split("flags:")[1].split()[0], 8)
                found[sock.getsockname()[1]] = (sock, flags)
            else:
                sock.close()
    finally:
        os.close(pidfd)
    return found


@pytest.mark.slow
def test_the_main_and_ollama_ports_are_both_bound_by_listener_and_hold_against_a_second_bind(
    tmp_path,
):
    """Issue 41, 3: with `ollama_port` set the main port was bound by uvicorn's
    `bind_socket` (SO_REUSEADDR, which on Windows lets another program bind the live
    port and receive its requests; and inheritable, so any child started with inherited
    handles would hold the port past the server). Both ports are now `listener`'s: on
    Windows SO_EXCLUSIVEADDRUSE and never SO_REUSEADDR, elsewhere what uvicorn sets
    (SO_REUSEADDR, for a restart over TIME_WAIT) and never SO_REUSEPORT; neither
    inheritable. A second socket setting SO_REUSEADDR, as a port thief would on Windows,
    cannot bind either port."""
    second = free_port()
    server = ServerProcess(
        [
            sys.executable, "-m", "app", "serve", "--device", "simulated:1GiB",
            "--model", "sim=simulated", "--ollama-port", str(second),
            "--data-dir", str(tmp_path / "d"), "--log-dir", str(tmp_path / "l"),
        ]
    )  # fmt: skip
    try:
        server.wait_ready(120)
        for port in (server.port, second):
            with socket.socket() as thief:
                thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                with pytest.raises(OSError):
                    thief.bind(("127.0.0.1", port))
        if sys.platform.startswith("linux"):
            sockets = _listening_sockets_of(server.process.pid)
            assert sorted(sockets) == sorted((server.port, second))
            for port, (sock, flags) in sockets.items():
                with sock:
                    options = {
                        "SO_REUSEADDR": sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR),
                        "SO_REUSEPORT": sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT),
                        "inheritable": not flags & O_CLOEXEC,
                    }
                    expected = {"SO_REUSEADDR": 1, "SO_REUSEPORT": 0, "inheritable": False}
                    assert options == expected, port
        if sys.platform == "win32":  # the options themselves; no pidfd there
            assert probe_options() == [(WINDOWS_SO_EXCLUSIVEADDRUSE, 1)]
    finally:
        assert server.stop() == 0
