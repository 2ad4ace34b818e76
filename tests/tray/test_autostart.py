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


class InMemoryRegistry:
    """HKEY_CURRENT_USER's values as a dict: winreg cannot run here. What the tests below
    check is the logic over the two keys; WindowsRegistry is three winreg calls."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], str | bytes] = {}

    def read(self, key: str, name: str) -> str | bytes | None:
        return self.values.get((key, name))

    def write(self, key: str, name: str, value: str) -> None:
        self.values[(key, name)] = value

    def delete(self, key: str, name: str) -> None:
        self.values.pop((key, name), None)


# What Task Manager's Startup tab writes (HKCU\...\Explorer\StartupApproved\Run): a
# first byte, 3 bytes of zeros and the FILETIME of the change (zeros when enabled).
DISABLED_BY_TASK_MANAGER = bytes.fromhex("03000000d40d438dc83bd901")
ENABLED_BY_TASK_MANAGER = bytes.fromhex("020000000000000000000000")


def test_windows_run_key_switched_off_in_task_manager_reads_off_in_memory_registry():
    """Issue 41, 5: the menu read only the Run key, so after the person switched
    vramgate off in Task Manager (which leaves the Run value and writes a disabled flag
    under StartupApproved\\Run) the menu still showed it on."""
    from tray.autostart import APPROVED_KEY, RUN_KEY, VALUE_NAME

    registry = InMemoryRegistry()
    autostart = Autostart([r"C:\Program Files\vramgate\vramgate.exe"], registry=registry)
    assert not autostart.enabled()
    autostart.set(True)
    assert registry.values == {(RUN_KEY, VALUE_NAME): r'"C:\Program Files\vramgate\vramgate.exe"'}
    assert autostart.enabled()  # no StartupApproved value: Windows runs it
    registry.values[(APPROVED_KEY, VALUE_NAME)] = DISABLED_BY_TASK_MANAGER
    assert not autostart.enabled()
    registry.values[(APPROVED_KEY, VALUE_NAME)] = ENABLED_BY_TASK_MANAGER
    assert autostart.enabled()
    registry.values[(APPROVED_KEY, VALUE_NAME)] = b"\x06" + bytes(11)  # also seen enabled
    assert autostart.enabled()


def test_windows_switching_on_from_the_menu_clears_task_managers_flag_in_memory_registry(
    tmp_path,
):
    """Switching on after Task Manager switched it off: writing the Run value alone
    would leave Windows skipping it at login; the disabled flag goes too. Switching off
    leaves neither value."""
    from tray.autostart import APPROVED_KEY, RUN_KEY, VALUE_NAME
    from tray.menu import TrayActions
    from tray.supervisor import Supervisor

    registry = InMemoryRegistry()
    registry.values[(RUN_KEY, VALUE_NAME)] = "vramgate.exe"
    registry.values[(APPROVED_KEY, VALUE_NAME)] = DISABLED_BY_TASK_MANAGER
    autostart = Autostart(["vramgate.exe"], registry=registry)
    supervisor = Supervisor(["true"], log_dir=tmp_path, pid_file=tmp_path / "pid")
    actions = TrayActions("http://127.0.0.1:9", supervisor, tmp_path, autostart=autostart)
    actions.toggle_autostart(None)  # the menu item, as the person clicks it
    assert autostart.enabled()
    assert (APPROVED_KEY, VALUE_NAME) not in registry.values
    actions.toggle_autostart(None)
    assert not autostart.enabled() and registry.values == {}
