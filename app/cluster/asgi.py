"""One HTTP request handed to an ASGI app in this process, and its answer as it comes.

A replica runs vramgate's own FastAPI app, lifespan and all, and answers the ingress's
requests through it: the same guard, bounds, gate and encoders as on one machine, with
no socket between. The answer comes back as its head (status and headers) and then its
body's chunks as the app sends them, so a stream stays a stream. A caller that stops
reading (its client left) is a disconnect the app hears, as over a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message


@dataclass(frozen=True)
class Forwarded:
    """A request as the ingress received it: what the app needs to answer it."""

    method: str
    path: str
    query: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""
    # The caller's address; None where it is not known, which no check takes for
    # loopback (the admin routes answer loopback callers only).
    client: tuple[str, int] | None = None


def caller_address(client: tuple[str, int] | None) -> tuple[str, int] | None:
    """The address a replica is told the request came from: the ingress's peer as it
    is, or None when the ingress has none (never a stand-in such as 127.0.0.1)."""
    return (client[0], client[1]) if client else None


@dataclass
class Head:
    """The answer's status and headers, before any of its body."""

    status: int
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode()
        return next((v.decode("latin-1") for k, v in self.headers if k.lower() == wanted), None)


def _scope(request: Forwarded) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode(),
        "query_string": request.query,
        "root_path": "",
        "headers": list(request.headers),
        "client": request.client,
        "server": ("127.0.0.1", 0),
        "state": {},
    }


async def answer(app: ASGIApp, request: Forwarded) -> AsyncIterator[Head | bytes]:
    """The app's answer to `request`: its `Head`, then each non-empty body chunk."""
    sent: asyncio.Queue[Message | None] = asyncio.Queue()
    gone = asyncio.Event()  # set when our caller stops reading
    body_read = False

    async def receive() -> Message:
        nonlocal body_read
        if not body_read:
            body_read = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await sent.put(message)

    async def run() -> None:
        try:
            await app(_scope(request), receive, send)
        finally:
            await sent.put(None)

    task = asyncio.create_task(run())
    complete = False
    try:
        while (message := await sent.get()) is not None:
            if message["type"] == "http.response.start":
                yield Head(message["status"], list(message.get("headers", [])))
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body", False):
                    complete = True
                    break
        if not complete:
            await task  # raises what ended the app before its answer did
    finally:
        gone.set()
        if not task.done():
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=5)
