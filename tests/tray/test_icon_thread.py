"""Updates reach the icon on its own thread (tray.icon_thread)."""

from __future__ import annotations

import importlib.util
import queue
import re
import sys
import threading
from pathlib import Path

import pytest

from tray.icon_thread import (
    WM_PYSTRAY_NOTIFY,
    WM_USER,
    WM_VRAMGATE_UPDATE,
    Win32Updates,
    direct,
    updates_for,
)


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
    assert f"WM_NOTIFY = WM_USER + {WM_PYSTRAY_NOTIFY - WM_USER}" in source  # its clicks


def test_backends_that_marshal_their_own_updates_are_called_directly():
    class XorgLike:
        pass

    assert updates_for(XorgLike()) is direct


class Win32Icon(Win32IconStandIn):
    """Of pystray's win32 backend, as its module says."""

    __module__ = "pystray._win32"


class AppsWin32Icon(Win32Icon):
    """A subclass of it in a module of ours, as tray.app may make."""

    __module__ = "tray.app"


@pytest.mark.parametrize("icon_class", [Win32Icon, AppsWin32Icon])
def test_a_win32_icon_gets_its_updates_posted(icon_class):
    """The backend is told by the modules of the icon's classes: a win32 icon gets the
    posted path (pystray#60), never the direct one; an update from another thread waits
    for the window procedure."""
    icon = icon_class()
    posted: list[tuple[int, int, int, int]] = []
    updates = updates_for(icon, lambda *message: posted.append(message))
    assert isinstance(updates, Win32Updates)
    ran: list[str] = []
    monitor = threading.Thread(target=updates, args=(lambda: ran.append("ran"),))
    monitor.start()
    monitor.join()
    assert ran == [] and posted == [(0x1234, WM_VRAMGATE_UPDATE, 0, 0)]
    icon._message_handlers[WM_VRAMGATE_UPDATE](0, 0)
    assert ran == ["ran"]


@pytest.mark.skipif(sys.platform != "win32", reason="pystray's win32 backend: the Windows CI job")
def test_the_real_win32_icon_runs_an_update_from_another_thread_on_its_own():
    """pystray's own win32 icon, made as tray.app makes it and running (its window made,
    not shown): an update from this thread is posted with PostMessageW and run by
    pystray's window procedure on the icon's thread."""
    import pystray
    from PIL import Image

    from tray.xorg_icon import icon_class

    icon = icon_class(pystray.Icon)("vramgate-test", Image.new("RGBA", (16, 16)))
    updates = updates_for(icon)
    assert isinstance(updates, Win32Updates)
    ready = threading.Event()
    loop = threading.Thread(target=icon.run, kwargs={"setup": lambda _icon: ready.set()})
    loop.start()
    try:
        assert ready.wait(timeout=30)  # its window is made
        ran: queue.SimpleQueue[threading.Thread] = queue.SimpleQueue()
        updates(lambda: ran.put(threading.current_thread()))
        assert ran.get(timeout=30) is loop
    finally:
        icon.stop()
        loop.join(timeout=30)
    assert not loop.is_alive()


def test_win32_an_update_dispatched_while_the_menu_shows_waits_until_it_closes():
    """TrackPopupMenuEx's modal loop dispatches posted messages: our update could run on
    the icon's thread inside pystray's click handler, while the menu it would destroy is
    open. It waits for the handler to return."""
    icon = Win32IconStandIn()
    events: list[str] = []

    def click(wparam: int, lparam: int) -> int:  # pystray's _on_notify, menu open
        events.append("menu open")
        updates(lambda: events.append("menu rebuilt"))
        icon._message_handlers[WM_VRAMGATE_UPDATE](0, 0)  # the modal loop dispatches it
        events.append("menu closed")
        return 0

    icon._message_handlers[WM_PYSTRAY_NOTIFY] = click
    posted: list[tuple[int, int, int, int]] = []
    updates = Win32Updates(icon, lambda *message: posted.append(message))
    icon._thread = None  # the update comes from another thread: posted
    icon._message_handlers[WM_PYSTRAY_NOTIFY](0, 0x205)  # WM_RBUTTONUP
    assert events == ["menu open", "menu closed", "menu rebuilt"]
