"""Where a message that ends the tray reaches the person (the delivery itself is tested
with the real tray under Xvfb: tests/tray/test_tray_xvfb.py, and test_bad_config.py)."""

from __future__ import annotations

import pytest

from tray.messages import channel_for, port_taken_text

CHANNELS = [
    pytest.param(True, "win32", False, "notification", id="Windows with its icon"),
    pytest.param(False, "win32", False, "message box", id="Windows before any icon"),
    pytest.param(True, "linux", True, "notification", id="a backend that notifies"),
    pytest.param(False, "linux", True, "notify-send", id="X11 icon, or none yet"),
    pytest.param(False, "darwin", False, "log", id="nothing to show it with"),
]


@pytest.mark.parametrize(("icon_notifies", "platform", "notify_send", "expected"), CHANNELS)
def test_channel_table(icon_notifies, platform, notify_send, expected):
    got = channel_for(icon_notifies=icon_notifies, platform=platform, notify_send=notify_send)
    assert got == expected


def test_the_port_message_names_the_port_and_what_to_do():
    text = port_taken_text("127.0.0.1", 8765, "/home/me/.config/vramgate/config.toml")
    assert text.startswith("vramgate cannot start: port 8765 on 127.0.0.1 is in use")
    assert "port = ... in /home/me/.config/vramgate/config.toml" in text
