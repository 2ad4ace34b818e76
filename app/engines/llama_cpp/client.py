"""Talking to a runner over loopback HTTP, on asyncio's streams: requests by hand, one
connection each (a response of one shape, from our own child, on 127.0.0.1). The token
stream is read on the event loop with no thread hop per token: on a small machine every
bit of our CPU per token is taken from the runner's own threads (measured on 2 cores:
0.47 ms of server CPU a token through httpx on a stream thread, 0.35 ms this way, and
the ratio to llama.cpp's own server went from 0.87 to 0.99 for one stream)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

# How long a runner's HTTP threads may take to answer /health: they answer at once, even
# while the runner computes (tried: 0.03-0.08 s during a 168 s embedding on 2 busy cores).
HEALTH_TIMEOUT_S = 5.0


class RunnerAnswer(Exception):
    """The runner answered a request with an error status: its own message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RunnerClient:
    def __init__(self, host: str, port: int, key: str, timeout_s: float = 120.0) -> None:
        """`timeout_s`: the longest a one-answer call (`call`, `text`) may take; a runner
        that has not answered by then is taken for gone (TimeoutError, an OSError)."""
        self.host, self.port = host, port
        self._auth = b"Bearer " + key.encode()
        self.timeout_s = timeout_s

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        budget_s: float | None = None,
        alive: Callable[[], None] | None = None,
    ) -> Any:
        """One request, its JSON answer, within `timeout_s`. RunnerAnswer for an error
        status; OSError (TimeoutError among them), asyncio.IncompleteReadError or
        ValueError when the runner is gone or silent.

        `budget_s`: a computation that reports no progress on the way (an embedding
        batch is one decode): every half `timeout_s` without its answer the runner is
        asked for its /health, which its HTTP threads answer while it computes; one that
        answers is waited for, up to `budget_s` in all (each answer calls `alive`: the
        run's beat for the watchdog), one that does not (stopped) is silent."""
        if budget_s is None or budget_s <= self.timeout_s:
            async with asyncio.timeout(self.timeout_s):
                return await self._call(method, path, body)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        answer = asyncio.ensure_future(self._call(method, path, body))
        try:
            while True:
                left = deadline - loop.time()
                done, _ = await asyncio.wait({answer}, timeout=min(self.timeout_s / 2, left))
                if done:
                    return answer.result()
                if left <= self.timeout_s / 2:
                    raise TimeoutError(f"no answer to {path} within {budget_s:g}s")
                async with asyncio.timeout(min(self.timeout_s / 2, HEALTH_TIMEOUT_S)):
                    await self._call("GET", "/health", None)
                if alive is not None:
                    alive()  # it answered: computing
        finally:
            answer.cancel()  # closes its connection, if it is still open

    async def _call(self, method: str, path: str, body: Any) -> Any:
        reader, writer = await self._send(method, path, body)
        try:
            status, chunked, length = await _head(reader)
            if chunked:
                content = b"".join([piece async for piece in _pieces(reader, chunked=True)])
            else:
                content = await reader.readexactly(length) if length else await reader.read()
        finally:
            writer.close()
        if status >= 400:
            raise RunnerAnswer(status, _message(content))
        return orjson.loads(content) if content else None

    async def text(self, path: str) -> str:
        """A GET whose answer is text (the runner's /metrics), within `timeout_s`."""
        async with asyncio.timeout(self.timeout_s):
            return await self._text(path)

    async def _text(self, path: str) -> str:
        reader, writer = await self._send("GET", path, None)
        try:
            _, chunked, length = await _head(reader)
            if chunked:
                return b"".join([p async for p in _pieces(reader, chunked=True)]).decode()
            return (await (reader.readexactly(length) if length else reader.read())).decode()
        finally:
            writer.close()

    async def events(
        self, path: str, body: Any, look: Callable[[], Awaitable[None]] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """A POST answered with server-sent events: each event's JSON as it comes.
        Leaving the iteration closes the connection; the runner cancels the task when
        it notices (its HTTP thread polls the socket: up to a second and a batch).
        Only its connection has a deadline (`timeout_s`): between events the watchdog
        watches the run (a prefill's progress events and each token are its beats).

        `look`: awaited while the stream has been silent for half `timeout_s`, every
        half `timeout_s`: the caller looks at the runner's work itself (its /slots,
        answered between batches) and beats where it moved."""
        async with asyncio.timeout(self.timeout_s):
            reader, writer = await self._send("POST", path, body)
        loop = asyncio.get_running_loop()
        heard = [loop.time()]
        looking = asyncio.ensure_future(self._look_while_silent(heard, look)) if look else None
        try:
            status, chunked, _ = await _head(reader)
            if status >= 400:
                content = b"".join([p async for p in _pieces(reader, chunked)])
                raise RunnerAnswer(status, _message(content))
            pending = b""
            async for data in _pieces(reader, chunked):
                heard[0] = loop.time()
                pending += data
                *events, pending = pending.split(b"\n\n")
                for event in events:
                    if event.startswith(b"data: "):
                        yield orjson.loads(event[6:])
        finally:
            if looking is not None:
                looking.cancel()
            writer.close()

    async def _look_while_silent(
        self, heard: list[float], look: Callable[[], Awaitable[None]]
    ) -> None:
        """While a stream has been silent for half `timeout_s`, `look` every half
        `timeout_s`. A request whose prompt waits behind others' prefill batches, or a
        batch that sends nothing until it is done, is silent while the runner works; a
        runner whose loop hangs while its HTTP threads answer is silent and still."""
        loop = asyncio.get_running_loop()
        period = self.timeout_s / 2
        while True:
            await asyncio.sleep(period)
            if loop.time() - heard[0] >= period:
                await look()

    async def _send(
        self, method: str, path: str, body: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        content = b"" if body is None else orjson.dumps(body)
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n".encode()
            + b"Content-Type: application/json\r\nAuthorization: "
            + self._auth
            + b"\r\nContent-Length: "
            + str(len(content)).encode()
            + b"\r\n\r\n"
            + content
        )
        await writer.drain()
        return reader, writer


async def _head(reader: asyncio.StreamReader) -> tuple[int, bool, int]:
    """The status, whether the body is chunked, and its length (0: unsaid). A runner
    that closes the connection before it answers is gone (ConnectionResetError)."""
    line = await reader.readline()
    parts = line.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ConnectionResetError(f"the runner answered no status line: {line[:80]!r}")
    status = int(parts[1])
    chunked, length = False, 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            chunked = value.strip().lower() == b"chunked"
        elif name == b"content-length":
            length = int(value.strip())
    return status, chunked, length


async def _pieces(reader: asyncio.StreamReader, chunked: bool) -> AsyncIterator[bytes]:
    """A response body as it arrives: its chunks, or what each read gives."""
    while True:
        if chunked:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            yield (await reader.readexactly(size + 2))[:-2]
        else:
            data = await reader.read(65536)
            if not data:
                return
            yield data


def _message(content: bytes) -> str:
    """An error answer's message: llama.cpp's {"error": {"message": ...}}, else its text."""
    try:
        found = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content.decode("utf-8", errors="replace")
    error = found.get("error") if isinstance(found, dict) else None
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    return content.decode("utf-8", errors="replace")
