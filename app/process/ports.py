"""Whether a local port can be listened on: asked by `serve` before it starts uvicorn and
by the tray before it starts a server child (both exit 74 when it cannot).

The probe binds as exclusively as the OS allows. On Windows `SO_REUSEADDR` lets a socket
bind over a live listener (the probe would say "free" while a server holds the port), so
the probe sets `SO_EXCLUSIVEADDRUSE` there and never `SO_REUSEADDR`. Elsewhere a plain
bind fails on a live listener and succeeds over connections lingering in TIME_WAIT only
with `SO_REUSEADDR`, which is what uvicorn itself sets.
"""

from __future__ import annotations

import socket
import sys

# winsock2.h: SO_REUSEADDR is 4 and SO_EXCLUSIVEADDRUSE is ((int)(~SO_REUSEADDR)); Python's
# socket module has the latter on Windows only, so other platforms' checks spell it out.
WINDOWS_SO_REUSEADDR = 4
WINDOWS_SO_EXCLUSIVEADDRUSE = ~WINDOWS_SO_REUSEADDR


def probe_options(platform: str = sys.platform) -> list[tuple[int, int]]:
    """(option, value) pairs the probe sets at SOL_SOCKET on `platform`."""
    if platform == "win32":
        return [(getattr(socket, "SO_EXCLUSIVEADDRUSE", WINDOWS_SO_EXCLUSIVEADDRUSE), 1)]
    return [(socket.SO_REUSEADDR, 1)]


def port_free(host: str, port: int) -> bool:
    if port == 0:
        return True
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        for option, value in probe_options():
            probe.setsockopt(socket.SOL_SOCKET, option, value)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def listener(host: str, port: int) -> socket.socket:
    """A socket listening on (host, port), bound as the probe binds (raises OSError when
    the port is taken). Every port the server listens on is one of these, handed to
    uvicorn whole: uvicorn's own `bind_socket` sets SO_REUSEADDR on every OS (on Windows,
    another program could then bind the live port and take its requests) and makes the
    socket inheritable. Python's sockets are not inheritable (PEP 446), so no child of
    the server holds the port past it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        for option, value in probe_options():
            sock.setsockopt(socket.SOL_SOCKET, option, value)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock
