"""The port probe (app.process.ports), which the tray and `serve` both ask before starting."""

from __future__ import annotations

import socket
import sys

import pytest

from app.process.ports import (
    WINDOWS_SO_EXCLUSIVEADDRUSE,
    WINDOWS_SO_REUSEADDR,
    port_free,
    probe_options,
)


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
