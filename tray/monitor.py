"""The monitor: polls GET /status once a second and hands the tray a new view when
anything it shows has changed."""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from tray.supervisor import Supervisor
from tray.view import TrayView, view_of

log = logging.getLogger("vramgate.tray.monitor")


def fetch_status(url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=timeout) as response:
            return json.load(response)
    except (urllib.error.URLError, OSError, ValueError):
        return None


class Monitor:
    def __init__(
        self,
        url: str,
        supervisor: Supervisor,
        on_view: Callable[[TrayView, TrayView | None], None],
        *,
        interval_s: float = 1.0,
    ) -> None:
        self.url = url
        self.supervisor = supervisor
        self.on_view = on_view
        self.interval_s = interval_s
        self.view: TrayView | None = None
        self._queue_full = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def poll(self) -> TrayView:
        """One poll; calls `on_view` if the view changed."""
        status = fetch_status(self.url)
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
