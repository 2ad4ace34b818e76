"""Runs the tray's updates (icon image, tooltip, menu, notification) on the icon's own
thread, on every pystray backend.

- win32: pystray's `update_menu` destroys the menu (`DestroyMenu`) and builds a new one
  on the calling thread, while the icon's thread may be tracking that menu in
  `TrackPopupMenuEx` (pystray#60, open). An update is posted to the icon's window as a
  message of ours instead; pystray's window procedure looks each message up in the icon's
  `_message_handlers` and runs it on the icon's thread. The menu's own modal loop
  dispatches posted messages too, so while pystray's click handler is showing the menu
  the updates wait, and run when it returns.
- GTK and AppIndicator: pystray runs every update from the GLib main loop already
  (`GObject.idle_add`, pystray#59).
- xorg: pystray hands every update to its mainloop thread already (`tray.xorg_icon`
  keeps those wake-ups off the mainloop's X connection).
- macOS: AppKit wants the main thread: PyObjC's `AppHelper.callAfter` (untested here).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

Update = Callable[[], None]
# winuser.h: private window messages from WM_USER (0x400) up; pystray uses WM_USER + 10
# (stop) and WM_USER + 11 (its notify-icon callback).
WM_USER = 0x400
WM_PYSTRAY_NOTIFY = WM_USER + 11  # the icon's clicks; a right click shows the menu
WM_VRAMGATE_UPDATE = WM_USER + 0x40


class Win32Updates:
    """Updates queued here and run by the icon's window procedure."""

    def __init__(self, icon: Any, post: Callable[[Any, int, int, int], Any]) -> None:
        self.icon = icon
        self._post = post  # PostMessageW
        self._pending: queue.SimpleQueue[Update] = queue.SimpleQueue()
        self._in_click = False  # in pystray's click handler (the menu may be showing)
        handlers = icon._message_handlers
        handlers[WM_VRAMGATE_UPDATE] = self._run_pending
        clicked = handlers.get(WM_PYSTRAY_NOTIFY)
        if clicked is not None:
            handlers[WM_PYSTRAY_NOTIFY] = self._click_handler(clicked)

    def _click_handler(self, clicked: Callable[[int, int], Any]) -> Callable[[int, int], Any]:
        def handle(wparam: int, lparam: int) -> Any:
            self._in_click = True
            try:
                return clicked(wparam, lparam)  # returns once the menu is closed
            finally:
                self._in_click = False
                self._run_pending(0, 0)

        return handle

    def __call__(self, update: Update) -> None:
        hwnd = getattr(self.icon, "_hwnd", None)
        if hwnd is None or threading.current_thread() is getattr(self.icon, "_thread", None):
            update()  # no window yet (nothing to race), or already on the icon's thread
            return
        self._pending.put(update)
        self._post(hwnd, WM_VRAMGATE_UPDATE, 0, 0)

    def _run_pending(self, _wparam: int, _lparam: int) -> int:
        if self._in_click:  # dispatched by the menu's modal loop: after it, not under it
            return 0
        while True:
            try:
                update = self._pending.get_nowait()
            except queue.Empty:
                return 0
            update()


def direct(update: Update) -> None:
    update()


def darwin_main_thread(update: Update) -> None:
    from PyObjCTools import AppHelper  # type: ignore[import-not-found]

    AppHelper.callAfter(update)


def updates_for(
    icon: Any, post: Callable[[Any, int, int, int], Any] | None = None
) -> Callable[[Update], None]:
    """How to run an update of `icon` on its own thread, from any thread. The backend is
    the module of one of the icon's classes (tray.app's icon may be a subclass of
    pystray's); a win32 icon's updates are posted with `post` (pystray's PostMessageW
    where none is given)."""
    modules = {cls.__module__ for cls in type(icon).__mro__}
    if "pystray._win32" in modules:
        if post is None:
            from pystray._util import win32  # type: ignore[import-not-found]

            post = win32.PostMessage
        return Win32Updates(icon, post)
    if "pystray._darwin" in modules:
        return darwin_main_thread
    return direct
