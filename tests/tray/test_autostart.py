"""Start at login: off by default, an XDG autostart entry when switched on."""

from __future__ import annotations

import sys

import pytest

from tray.autostart import Autostart


@pytest.mark.skipif(sys.platform == "win32", reason="the XDG entry; Windows uses the Run key")
def test_xdg_autostart_entry_is_opt_in_and_removable(tmp_path):
    autostart = Autostart(["/opt/vramgate/vramgate"], config_dir=tmp_path)
    assert not autostart.enabled()
    autostart.set(True)
    entry = (tmp_path / "autostart" / "vramgate.desktop").read_text()
    assert "Exec=/opt/vramgate/vramgate" in entry and "Type=Application" in entry
    assert autostart.enabled()
    autostart.set(False)
    assert not autostart.enabled()
    autostart.set(False)  # switching off twice is fine


def test_start_at_login_never_opens_a_console_window_on_windows():
    from tray.autostart import tray_command

    venv = r"C:\Users\me\vramgate\.venv\Scripts\python.exe"
    assert tray_command(venv, frozen=False, platform="win32") == [
        r"C:\Users\me\vramgate\.venv\Scripts\pythonw.exe",
        "-m",
        "app",
    ]
    bundle = r"C:\Program Files\vramgate\vramgate.exe"  # the windowed executable
    assert tray_command(bundle, frozen=True, platform="win32") == [bundle]
    assert tray_command("/usr/bin/python3", frozen=False, platform="linux") == [
        "/usr/bin/python3",
        "-m",
        "app",
    ]
