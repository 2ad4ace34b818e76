"""Start at login, opt-in and off by default: the Run key on Windows, an XDG autostart
entry elsewhere."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path, PureWindowsPath

import platformdirs

RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"
VALUE_NAME = "vramgate"


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
    def __init__(self, command: list[str] | None = None, config_dir: Path | None = None) -> None:
        self.command = command or tray_command()
        self._config_dir = config_dir or Path(platformdirs.user_config_dir())

    @property
    def desktop_file(self) -> Path:
        return self._config_dir / "autostart" / "vramgate.desktop"

    def enabled(self) -> bool:
        if sys.platform == "win32":
            return self._read_run_key() is not None
        return self.desktop_file.is_file()

    def set(self, enabled: bool) -> None:
        if sys.platform == "win32":
            self._write_run_key(enabled)
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

    def _read_run_key(self) -> str | None:
        if sys.platform != "win32":
            return None
        import winreg

        try:
            with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
                return str(winreg.QueryValueEx(key, VALUE_NAME)[0])
        except OSError:
            return None

    def _write_run_key(self, enabled: bool) -> None:
        if sys.platform != "win32":
            return
        import winreg

        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_SET_VALUE) as key:
            if enabled:
                value = subprocess.list2cmdline(self.command)
                winreg.SetValueEx(key, VALUE_NAME, 0, winreg.REG_SZ, value)
            else:
                with contextlib.suppress(FileNotFoundError):
                    winreg.DeleteValue(key, VALUE_NAME)
