"""The one watcher of a request's connection: it tells whoever holds the request now
(the queue while it waits, a non-streamed reply while it generates) that the client left.

One task reads the connection for the whole request, started only when something asks
(most requests never wait long enough), and is cancelled when the request is answered:
a streamed response reads the connection itself, so its watch ends before it starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class ClientWatch:
    def __init__(self, gone: Callable[[], Awaitable[None]] | None) -> None:
        """`gone` returns once the client has disconnected (None: nobody to watch)."""
        self._gone = gone
        self._task: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._callback: Callable[[], None] | None = None
        self.left = False

    def on_leave(self, callback: Callable[[], None], after: float = 0.0) -> None:
        """Call `callback` if the client leaves, watching from `after` seconds on (the
        watch already running goes on, and tells this callback instead)."""
        self._callback = callback
        if self.left:
            callback()
            return
        if self._gone is None or self._task is not None or self._timer is not None:
            return
        if after > 0:
            self._timer = asyncio.get_running_loop().call_later(after, self._start)
        else:
            self._start()

    def clear(self) -> None:
        """Nobody to tell for now (a timer not yet fired is dropped)."""
        self._callback = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        """The request is answered: stop reading the connection."""
        self.clear()
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def __enter__(self) -> ClientWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        self._timer = None
        assert self._gone is not None
        self._task = asyncio.ensure_future(self._gone())
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Future[None]) -> None:
        if task.cancelled():
            return
        self.left = True
        if self._callback is not None:
            self._callback()
