"""The monitor: polls GET /status once a second and hands the tray a new view when
anything it shows has changed."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

from tray.supervisor import Supervisor
from tray.view import TrayView, view_of

log = logging.getLogger("vramgate.tray.monitor")


class StatusConnection:
    """GET /status over one kept-alive HTTP/1.1 connection, opened again when it broke
    (a restarted server). One connection for the tray's life, not one a second: a poll
    that asked the server to close left a TIME_WAIT on the server's own port each time,
    where a restarted server binds (Windows' exclusive bind may refuse it over them)."""

    def __init__(
        self, url: str, token: Callable[[], str | None] = lambda: None, timeout: float = 2.0
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.token = token
        self.timeout = timeout
        self._connection: http.client.HTTPConnection | None = None
        # guards _connection: the monitor polls on its thread, a restart closes it from
        # another (waiting at most one poll's timeout)
        self._lock = threading.Lock()

    def fetch(self) -> dict[str, Any] | None:
        """/status, or None when the server does not answer (the poll is tried once more
        on a fresh connection when a kept one turns out closed)."""
        with self._lock:
            for fresh in (self._connection is None, True):
                try:
                    return self._get()
                except (OSError, http.client.HTTPException, ValueError):
                    self._close()
                    if fresh:
                        return None
            return None

    def _get(self) -> dict[str, Any] | None:
        if self._connection is None:
            self._connection = http.client.HTTPConnection(self.host, self.port, self.timeout)
        headers = {"Accept": "application/json"}
        token = self.token()  # read each time: an `auto` token appears at start
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._connection.request("GET", "/status", headers=headers)
        response = self._connection.getresponse()
        body = response.read()  # read whole, so the connection can carry the next poll
        if response.will_close:
            self._close()
        return json.loads(body) if response.status == 200 else None

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(OSError):
                self._connection.close()
            self._connection = None


def fetch_status(url: str, token: Callable[[], str | None] = lambda: None) -> dict[str, Any] | None:
    """One /status, on a connection of its own."""
    connection = StatusConnection(url, token)
    try:
        return connection.fetch()
    finally:
        connection.close()


class Monitor:
    def __init__(
        self,
        url: str,
        supervisor: Supervisor,
        on_view: Callable[[TrayView, TrayView | None], None],
        *,
        interval_s: float = 1.0,
        token: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.url = url
        self.status = StatusConnection(url, token)
        self.supervisor = supervisor
        self.on_view = on_view
        self.interval_s = interval_s
        self.view: TrayView | None = None
        self._queue_full = 0
        self._ending: int | None = None  # the pid of a server of ours being ended
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.status.close()

    def end_connection(self) -> None:
        """Before the supervisor ends its server (a restart, Quit): the kept-alive /status
        connection is closed from this side, so its TIME_WAIT is the tray's and not on the
        server's port, where Windows' exclusive bind may refuse the next server for up to
        240 s; and no poll opens another to that server while it ends."""
        self._ending = self.supervisor.pid
        self.status.close()

    def poll(self) -> TrayView:
        """One poll; calls `on_view` if the view changed."""
        ending = self._ending is not None and self.supervisor.pid == self._ending
        if not ending:
            self._ending = None
        status = None if ending else self.status.fetch()
        delta = 0
        if status is not None:
            queue_full = status["counters"]["rejected"].get("queue_full", 0)
            delta, self._queue_full = queue_full - self._queue_full, queue_full
        sup = self.supervisor
        view = view_of(
            status if sup.state in ("running", "starting") else None,
            supervisor_state=sup.state,
            supervisor_message=sup.message,
            restarts=sup.restarts,
            queue_full_delta=max(0, delta),
            previous=self.view,
            failure=sup.failure,
        )
        if view != self.view:
            previous, self.view = self.view, view
            self.on_view(view, previous)
        return view

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:  # the tray must outlive any one bad poll
                log.exception("monitor poll failed")
            self._stop.wait(self.interval_s)
