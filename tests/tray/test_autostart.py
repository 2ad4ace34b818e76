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
