"""Whether a local port can be listened on: asked by `serve` before it starts uvicorn and
by the tray before it starts a server child (both exit 74 when it cannot)."""

from __future__ import annotations

import socket


def port_free(host: str, port: int) -> bool:
    if port == 0:
        return True
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True
