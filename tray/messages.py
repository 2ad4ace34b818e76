"""Telling the person what ends the tray: a notification from the icon where its backend
has them (Windows), else a message box (Windows, before any icon exists), else a
desktop notification through `notify-send` (Linux; pystray's X11 icon has none), else
only the log (and the console, when there is one)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from typing import Any, Literal

log = logging.getLogger("vramgate.tray")
Channel = Literal["notification", "message box", "notify-send", "log"]


def channel_for(*, icon_notifies: bool, platform: str, notify_send: bool) -> Channel:
    """Where a message reaches the person. Pure."""
    if icon_notifies:
        return "notification"
    if platform == "win32":
        return "message box"
    return "notify-send" if notify_send else "log"


def port_taken_text(host: str, port: int, config: object) -> str:
    return (
        f"vramgate cannot start: port {port} on {host} is in use by another program.\n\n"
        f"Set another port (port = ... in {config}) or stop that program."
    )


def tell(title: str, text: str, icon: Any = None) -> Channel:
    """Show `text` to the person; the channel it went through ("log": shown nowhere)."""
    channel = channel_for(
        icon_notifies=icon is not None and bool(getattr(icon, "HAS_NOTIFICATION", False)),
        platform=sys.platform,
        notify_send=shutil.which("notify-send") is not None,
    )
    if channel == "notification":
        icon.notify(text, title)
    elif channel == "message box":
        _message_box(title, text)
    elif channel == "notify-send" and not _notify_send(title, text):
        channel = "log"
    if channel == "log":
        log.error("no way to show the message here (no notification, no notify-send)")
    return channel


def _message_box(title: str, text: str) -> None:
    import ctypes

    mb_iconerror = 0x10
    ctypes.windll.user32.MessageBoxW(None, text, title, mb_iconerror)  # type: ignore[attr-defined]


def _notify_send(title: str, text: str) -> bool:
    notify = shutil.which("notify-send") or "notify-send"
    try:
        done = subprocess.run([notify, "--urgency=critical", title, text], check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
