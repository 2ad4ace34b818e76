"""Start at login, opt-in and off by default: the Run key on Windows, an XDG autostart
entry elsewhere.

On Windows the Run value alone does not say whether Windows runs it: Task Manager's
Startup tab (and Settings ▸ Apps ▸ Startup) switch an entry off by writing a binary value
of the same name under `Explorer\\StartupApproved\\Run`, leaving the Run value in place.
Its first byte is 0x02 when enabled and 0x03 when disabled, followed by the FILETIME of
the change (zeros when enabled); Microsoft does not document the format, and values with
other even first bytes (0x06) are seen on enabled entries, so an odd first byte reads as
disabled. No value there means enabled. Switching on from our menu removes a disabled
flag as well, or Windows would go on skipping the entry.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path, PureWindowsPath
from typing import Protocol

import platformdirs

RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"
APPROVED_KEY = r"Software\Microsoft\Windows\CurrentVersion\Explorer\StartupApproved\Run"
VALUE_NAME = "vramgate"


class Registry(Protocol):
    """The values of keys under HKEY_CURRENT_USER: a str is REG_SZ, bytes REG_BINARY."""

    def read(self, key: str, name: str) -> str | bytes | None: ...

    def write(self, key: str, name: str, value: str) -> None: ...

    def delete(self, key: str, name: str) -> None: ...


def approved_disabled(flag: str | bytes | None) -> bool:
    """Whether a StartupApproved\\Run value says the entry is switched off."""
    return isinstance(flag, bytes) and len(flag) > 0 and flag[0] & 1 == 1


def run_key_enabled(registry: Registry) -> bool:
    """Registered in the Run key, and not switched off in Task Manager."""
    if registry.read(RUN_KEY, VALUE_NAME) is None:
        return False
    return not approved_disabled(registry.read(APPROVED_KEY, VALUE_NAME))


def set_run_key(registry: Registry, command: list[str], enabled: bool) -> None:
    """Register or unregister; either way no StartupApproved flag is left behind (one
    left disabled would keep the next switch-on from working)."""
    if enabled:
        registry.write(RUN_KEY, VALUE_NAME, subprocess.list2cmdline(command))
    else:
        registry.delete(RUN_KEY, VALUE_NAME)
    registry.delete(APPROVED_KEY, VALUE_NAME)


class WindowsRegistry:
    """HKEY_CURRENT_USER through winreg (Windows only)."""

    def read(self, key: str, name: str) -> str | bytes | None:
        import winreg

        try:
            with winreg.OpenKey(winreg.HKEY_CURRENT_USER, key) as handle:
                value = winreg.QueryValueEx(handle, name)[0]
        except OSError:  # no key, no value
            return None
        return value if isinstance(value, bytes) else str(value)

    def write(self, key: str, name: str, value: str) -> None:
        import winreg

        with winreg.CreateKeyEx(winreg.HKEY_CURRENT_USER, key, 0, winreg.KEY_SET_VALUE) as handle:
            winreg.SetValueEx(handle, name, 0, winreg.REG_SZ, value)

    def delete(self, key: str, name: str) -> None:
        import winreg

        with (
            contextlib.suppress(FileNotFoundError),  # no key or no value: nothing to delete
            winreg.OpenKey(winreg.HKEY_CURRENT_USER, key, 0, winreg.KEY_SET_VALUE) as handle,
        ):
            winreg.DeleteValue(handle, name)


def tray_command(
    executable: str = sys.executable,
    frozen: bool = getattr(sys, "frozen", False),
    platform: str = sys.platform,
) -> list[str]:
    """What starts the tray at login: the bundle's own (windowed) executable, or Python
    running the app. On Windows, `pythonw.exe` (no console window at every login), which
    every Windows Python install and venv has beside `python.exe`."""
    if frozen:
        return [executable]
    if platform == "win32":
        path = PureWindowsPath(executable)
        if path.name.lower() == "python.exe":
            executable = str(path.with_name("pythonw.exe"))
    return [executable, "-m", "app"]


class Autostart:
    def __init__(
        self,
        command: list[str] | None = None,
        config_dir: Path | None = None,
        registry: Registry | None = None,
    ) -> None:
        self.command = command or tray_command()
        self._config_dir = config_dir or Path(platformdirs.user_config_dir())
        if registry is None and sys.platform == "win32":
            registry = WindowsRegistry()
        self.registry = registry  # None: the XDG entry

    @property
    def desktop_file(self) -> Path:
        return self._config_dir / "autostart" / "vramgate.desktop"

    def enabled(self) -> bool:
        if self.registry is not None:
            return run_key_enabled(self.registry)
        return self.desktop_file.is_file()

    def set(self, enabled: bool) -> None:
        if self.registry is not None:
            set_run_key(self.registry, self.command, enabled)
        elif enabled:
            self.desktop_file.parent.mkdir(parents=True, exist_ok=True)
            self.desktop_file.write_text(
                "[Desktop Entry]\nType=Application\nName=vramgate\n"
                "Comment=Local GPU inference server\n"
                f"Exec={subprocess.list2cmdline(self.command)}\n"
                "X-GNOME-Autostart-enabled=true\n",
                encoding="utf-8",
            )
        else:
            self.desktop_file.unlink(missing_ok=True)
