"""The tray menu as plain data, and the actions behind it.

`build_menu` returns `Item`s whose actions take the icon; the tray app turns them into
pystray menu items. Kept free of pystray so the menu is tested without a display.
Actions talk to the server over HTTP only, like everything in the tray.

Every action returns at once: they run on the icon's own thread, which draws the icon
and its menu and answers Windows' messages (a tray that blocks there freezes, and at
logoff holds up Windows). What waits on the server (a request, a drain, a restart) runs
on a thread of its own; what is left on the icon's thread is local and quick (the
registry, starting a browser or a file manager).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import webbrowser
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from tray.autostart import Autostart
from tray.supervisor import Supervisor
from tray.view import ModelLine, TrayView

log = logging.getLogger("vramgate.tray.menu")
Action = Callable[[Any], None]  # called with the pystray icon


@dataclass(frozen=True)
class Item:
    text: str
    action: Action | None = None
    checked: bool | None = None  # None: not a checkbox
    enabled: bool = True
    submenu: tuple[Item, ...] = ()
    separator: bool = False


SEPARATOR = Item("-", separator=True)


def open_folder(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if sys.platform == "win32":
        os.startfile(path)  # type: ignore[attr-defined]
    elif sys.platform == "darwin":
        subprocess.Popen(["open", str(path)])
    else:
        subprocess.Popen(["xdg-open", str(path)])


def page_url(url: str, path: str, token: str | None) -> str:
    """A page's address; with a token, one that signs the browser in (the server answers
    with a cookie and the bare address)."""
    return url.rstrip("/") + path + (f"?{urlencode({'token': token})}" if token else "")


class TrayActions:
    def __init__(
        self,
        url: str,
        supervisor: Supervisor,
        log_dir: Path,
        *,
        autostart: Autostart | None = None,
        open_url: Callable[[str], object] = webbrowser.open,
        open_path: Callable[[Path], None] = open_folder,
        on_quit: Callable[[], None] = lambda: None,
        token: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.url = url.rstrip("/")
        self.supervisor = supervisor
        self.log_dir = log_dir
        self.autostart = autostart or Autostart()
        self.open_url = open_url
        self.open_path = open_path
        self.on_quit = on_quit
        self.token = token  # read each time: an `auto` token appears when the server starts
        self._quit_lock = threading.Lock()  # guards _quitting: a second Quit does nothing
        self._quitting = False

    def post(self, path: str) -> dict[str, Any] | None:
        request = urllib.request.Request(self.url + path, data=b"", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.load(response)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            log.warning("POST %s failed: %s", path, exc)
            return None

    def set_paused(self, paused: bool) -> None:
        self._in_background(self.post, "/admin/pause" if paused else "/admin/resume")

    def unload(self, name: str) -> Action:
        return lambda icon: self._in_background(self.post, f"/admin/models/{name}/unload")

    def load(self, name: str) -> Action:
        return lambda icon: self._in_background(self.post, f"/admin/models/{name}/load")

    def open_dashboard(self, icon: Any) -> None:
        self.open_url(self._page("/dashboard"))

    def open_library(self, icon: Any) -> None:
        """The dashboard at its Library: which model fits this machine, before the
        download (with a token the sign-in's redirect brings the dashboard's top)."""
        self.open_url(self._page("/dashboard") + "#library-section")

    def open_docs(self, icon: Any) -> None:
        self.open_url(self._page("/docs"))

    def _page(self, path: str) -> str:
        return page_url(self.url, path, self.token())

    def open_logs(self, icon: Any) -> None:
        self.open_path(self.log_dir)

    def restart_server(self, icon: Any) -> None:
        self._in_background(self.supervisor.restart)

    def toggle_autostart(self, icon: Any) -> None:
        self.autostart.set(not self.autostart.enabled())

    def quit(self, icon: Any) -> None:
        """Drain and stop the server (up to its drain bound), then end the tray: off the
        icon's thread, which goes on answering meanwhile."""
        with self._quit_lock:
            if self._quitting:
                return
            self._quitting = True
        self._in_background(self._quit, icon)

    def _quit(self, icon: Any) -> None:
        try:
            self.supervisor.stop()
            self.on_quit()
        finally:  # whatever the drain did, the tray ends
            if icon is not None and hasattr(icon, "stop"):
                icon.stop()

    @staticmethod
    def _in_background(fn: Callable[..., object], *args: object) -> None:
        # Menu callbacks run on the tray's event thread: never block it on the network.
        threading.Thread(target=fn, args=args, name="tray-action", daemon=True).start()


def _mib(value: int) -> str:
    return f"{value / 2**20:.0f} MiB"


# the kinds a model's name does not tell apart (a Whisper and a VITS are both "speech")
KIND_WORDS = {"speech": "speech to text", "speech_synthesis": "text to speech"}


def model_label(model: ModelLine) -> str:
    """ "name (text to speech, 90 MiB, 48%/52% CPU/GPU, ready, unloads at 14:32)": what it
    does where its kind needs saying, its memory, a GGUF's layer split, its state and when
    its keep-alive ends (a time, not a countdown: the menu is rebuilt only when what it
    shows changes)."""
    parts = [KIND_WORDS[model.kind]] if model.kind in KIND_WORDS else []
    if model.weights_bytes:
        parts.append(_mib(model.weights_bytes))
    if model.split:
        parts.append(model.split)
    parts.append(model.state)
    if model.unloads_at is not None:
        parts.append(f"unloads at {model.unloads_at}")
    return f"{model.name} ({', '.join(parts)})"


def build_menu(view: TrayView, actions: TrayActions) -> tuple[Item, ...]:
    status = tuple(Item(line, enabled=False) for line in view.lines)
    models = tuple(
        Item(
            model_label(m),
            submenu=(
                Item("Unload", actions.unload(m.name), enabled=m.state == "ready"),
                Item("Load", actions.load(m.name), enabled=m.state in ("unloaded", "failed")),
            ),
        )
        for m in view.models
    )
    return (
        *status,
        SEPARATOR,
        Item(
            "Models",
            submenu=(
                *(models or (Item("none loaded", enabled=False),)),
                SEPARATOR,
                Item("Find a model that fits this GPU…", actions.open_library),
            ),
        ),
        Item("Open dashboard", actions.open_dashboard),
        Item("Open API docs", actions.open_docs),
        Item("Open logs folder", actions.open_logs),
        SEPARATOR,
        Item(
            "Pause new requests",
            lambda icon: actions.set_paused(not view.paused),
            checked=view.paused,
        ),
        Item("Restart server", actions.restart_server),
        Item("Start at login", actions.toggle_autostart, checked=actions.autostart.enabled()),
        SEPARATOR,
        Item("Quit", actions.quit),
    )
