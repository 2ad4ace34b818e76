"""pystray's X11 (xorg) icon, docked once and safe to update from the monitor's thread.

Two things pystray's xorg backend does at every update, each seen under Xvfb + trayer:

- At every icon change it asks the tray host to dock the icon again (a server grab and a
  dock request for a window already docked). trayer answers by sizing the icon's window
  1 pixel wide: the icon vanished from a few seconds after the server became ready,
  while the icon changed (issue 29, finding 21). The icon is docked once, and again only
  when the host's window is gone (pystray's DestroyNotify handler does that). Showing an
  icon whose image is new asked twice (its image's update docked it, then showing did):
  trayer left it undocked at 1x1 after 14 of 45 launches on a loaded machine, 0 of 45
  with one request.
- It docks when it shows the icon, and again only when the tray host's window it docked
  in is destroyed, at that very moment: a panel that starts after the tray (a session
  that starts its programs first) or restarts (a desktop shell reloaded) never got the
  icon. A tray host announces itself (the freedesktop system tray spec: a `MANAGER`
  client message to the root window once it owns `_NET_SYSTEM_TRAY_Sn`); the icon docks
  in each new one.
- It runs every update on its mainloop thread: another thread sends a client message to
  the icon's window and waits for the mainloop's answer, sending over the mainloop's own
  X connection. python-xlib's locking of one connection used by two threads deadlocks
  now and then: the mainloop waits forever for the reply to a redraw's `get_geometry`
  while the monitor waits for the mainloop, and the icon freezes (at start in 2 of 4
  launches; within 300 updates in a row). Another thread's wake-up goes over a
  connection of its own, so the mainloop's connection has one user.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any


def icon_class(base: type) -> type:
    """`base` itself, or where it is pystray's xorg icon, the safe subclass of it."""
    if base.__module__ != "pystray._xorg":
        return base
    import Xlib.display
    import Xlib.protocol.event
    import Xlib.X

    class XorgIcon(DocksInEveryHost, base):  # type: ignore[misc,valid-type]
        def _rewrite_implementation(self, *originals: Callable[[], None]) -> None:
            super()._rewrite_implementation(*originals)  # the mainloop's handlers
            # guards _wake_display (one thread at a time on it) and pairs each wake-up
            # with its answer on pystray's result queue
            self._wake_lock = threading.Lock()
            self._wake_display: Any = None
            for original in originals:
                atom = self._display.intern_atom(f"_PYSTRAY_{original.__name__.upper()}")
                setattr(self, original.__name__, self._dispatcher(original, atom))
            self._watch_for_tray_hosts()

        def _dispatcher(self, original: Callable[[], None], atom: int) -> Any:
            def inner(_self: Any) -> None:
                if threading.current_thread() is getattr(self, "_thread", None):
                    original()
                    return
                with self._wake_lock:
                    self._wake(atom)
                    result = self._queue.get()
                if result is not True:
                    raise result[1].with_traceback(result[2])

            return types.MethodType(inner, self)

        def _wake(self, atom: int) -> None:
            if self._wake_display is None:
                self._wake_display = Xlib.display.Display()
            window = self._wake_display.create_resource_object("window", self._window.id)
            message = Xlib.protocol.event.ClientMessage(
                window=window, client_type=atom, data=(32, (Xlib.X.CurrentTime, 0, 0, 0, 0))
            )
            window.send_event(message, event_mask=Xlib.X.NoEventMask)
            self._wake_display.flush()

    XorgIcon.__name__ = XorgIcon.__qualname__ = "XorgIcon"
    XorgIcon.__module__ = __name__
    return XorgIcon


class DocksInEveryHost:
    """Docking for pystray's xorg icon (a mixin before it): once per tray host, in each
    host that takes the system tray. Its attributes are that icon's."""

    _display: Any
    _message_handlers: dict[int, Callable[[Any], None]]
    _net_system_tray_sx: int
    _systray_manager: Any
    _icon_data: Any
    _icon_valid: bool
    visible: bool

    def _watch_for_tray_hosts(self) -> None:
        """A new tray host's announcement comes to the root window (StructureNotifyMask
        there selects only the root's own events besides such messages); the mainloop
        hands it here, and every other client message to pystray's handler."""
        import Xlib.X

        manager = self._display.intern_atom("MANAGER")
        pystrays = self._message_handlers[Xlib.X.ClientMessage]

        def on_client_message(event: Any) -> None:
            if event.client_type == manager and event.data[1][1] == self._net_system_tray_sx:
                self._dock_in_new_host()
            else:
                pystrays(event)

        self._message_handlers[Xlib.X.ClientMessage] = on_client_message
        self._display.screen().root.change_attributes(event_mask=Xlib.X.StructureNotifyMask)

    def _show(self) -> None:
        if self._systray_manager is None:  # showing docks, unless its image did so
            super()._show()  # type: ignore[misc]

    def _dock_in_new_host(self) -> None:
        """A tray host took the system tray (on the mainloop's thread): the icon, if
        shown, docks in it and is drawn (its old host, if any, has gone)."""
        if not self.visible:
            return  # showing it docks it
        self._systray_manager = None
        try:
            self._assert_docked()  # type: ignore[attr-defined]
        except AssertionError:  # gone again already: its successor announces itself
            return
        self._icon_data = None
        self._draw()  # type: ignore[attr-defined]

    def _update_icon(self) -> None:
        if self._systray_manager is None:
            super()._update_icon()  # type: ignore[misc]  # docks, then draws
            return
        self._icon_data = None  # rebuilt from the new image at the window's size
        self._draw()  # type: ignore[attr-defined]
        self._icon_valid = True
