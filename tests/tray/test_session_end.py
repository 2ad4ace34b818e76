"""Windows' sign-out: the tray lets the session end (pystray alone answered
WM_QUERYENDSESSION with 0, "cannot end the session") and stops its server before
WM_ENDSESSION returns, within a drain bound Windows allows. Run through the icon's
message handlers as pystray's window procedure calls them, with a real child process."""

from __future__ import annotations

import sys
from typing import Any

from tests.support.live import wait_until
from tray.session_end import (
    SESSION_END_DRAIN_S,
    WM_ENDSESSION,
    WM_QUERYENDSESSION,
    stop_at_session_end,
)
from tray.supervisor import Supervisor


class Win32Icon:
    """What the handlers see of pystray's win32 icon: its module and its message table
    (pystray's _dispatcher calls `_message_handlers[uMsg](wParam, lParam)`, 0 where none)."""

    __module__ = "pystray._win32"

    def __init__(self) -> None:
        self._message_handlers: dict[int, Any] = {}

    def dispatch(self, message: int, wparam: int) -> int:
        return int(self._message_handlers.get(message, lambda _w, _l: 0)(wparam, 0) or 0)


class XorgIcon:
    __module__ = "pystray._xorg"

    def __init__(self) -> None:
        self._message_handlers: dict[int, Any] = {}


def test_the_tray_lets_windows_end_the_session_and_stops_its_server_first(tmp_path):
    supervisor = Supervisor(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        log_dir=tmp_path / "log",
        pid_file=tmp_path / "pid",
    )
    icon = Win32Icon()
    assert icon.dispatch(WM_QUERYENDSESSION, 0) == 0  # pystray alone: "cannot end"
    assert stop_at_session_end(icon, supervisor.stop)
    supervisor.start()
    try:
        wait_until(lambda: supervisor.state == "running", 10, "running")
        assert icon.dispatch(WM_QUERYENDSESSION, 0) == 1  # TRUE: it may end
        assert icon.dispatch(WM_ENDSESSION, 0) == 0  # cancelled by another program
        assert supervisor.state == "running"
        assert icon.dispatch(WM_ENDSESSION, 1) == 0  # it ends: stopped before returning
        assert supervisor.state == "stopped" and supervisor.drain_s == SESSION_END_DRAIN_S
    finally:
        supervisor.stop()


def test_other_backends_have_no_session_messages():
    icon = XorgIcon()
    assert not stop_at_session_end(icon, lambda drain_s: None)
    assert icon._message_handlers == {}
