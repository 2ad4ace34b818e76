"""Updates reach the icon on its own thread (tray.icon_thread)."""

from __future__ import annotations

import importlib.util
import re
import threading
from pathlib import Path

from tray.icon_thread import WM_USER, WM_VRAMGATE_UPDATE, Win32Updates, direct, updates_for


class Win32IconStandIn:
    """What Win32Updates uses of pystray's win32 icon (which cannot run here): its
    window, its thread and the table its window procedure dispatches messages from."""

    def __init__(self) -> None:
        self._hwnd = 0x1234
        self._thread = threading.current_thread()  # the test's thread plays the icon's
        self._message_handlers: dict[int, object] = {}


def test_win32_an_update_from_the_monitor_waits_for_the_icons_window_procedure():
    """pystray's win32 `update_menu` destroys and rebuilds the menu on the calling thread
    (pystray#60): an update from the monitor is posted to the icon's window and run by
    its window procedure, on the icon's thread."""
    icon = Win32IconStandIn()
    posted: list[tuple[int, int, int, int]] = []
    updates = Win32Updates(icon, lambda *message: posted.append(message))
    ran: list[str] = []
    monitor = threading.Thread(
        target=updates, args=(lambda: ran.append(threading.current_thread().name),)
    )
    monitor.start()
    monitor.join()
    assert ran == [] and posted == [(0x1234, WM_VRAMGATE_UPDATE, 0, 0)]
    # pystray's _dispatcher: icon._message_handlers.get(uMsg)(wParam, lParam)
    assert icon._message_handlers[WM_VRAMGATE_UPDATE](0, 0) == 0
    assert ran == [threading.current_thread().name]
    updates(lambda: ran.append("on the icon's thread"))  # already there: at once
    assert ran[-1] == "on the icon's thread" and len(posted) == 1


def test_our_window_message_is_none_of_pystrays():
    spec = importlib.util.find_spec("pystray")
    assert spec is not None and spec.submodule_search_locations
    source = (Path(spec.submodule_search_locations[0]) / "_util" / "win32.py").read_text()
    theirs = {WM_USER + int(n) for n in re.findall(r"= WM_USER \+ (\d+)", source)}
    assert theirs and WM_VRAMGATE_UPDATE not in theirs


def test_backends_that_marshal_their_own_updates_are_called_directly():
    class XorgLike:
        pass

    assert updates_for(XorgLike()) is direct
