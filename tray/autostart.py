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

The entry starts the tray with the config it runs with (`tray --config FILE`), and a tray
that finds the entry pointing elsewhere (a folder moved or deleted since, another config
of this same program) writes it again at start (`Autostart.repair`); an entry that
starts another copy of vramgate that still exists (a developer's venv beside the
installed one) is that copy's, and left alone.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path, PureWindowsPath
from typing import Protocol

import platformdirs

log = logging.getLogger("vramgate.tray.autostart")
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
    config_file: Path | None = None,
) -> list[str]:
    """What starts the tray at login: the bundle's own (windowed) executable, or Python
    running the app. On Windows, `pythonw.exe` (no console window at every login), which
    every Windows Python install and venv has beside `python.exe`. With the config the
    tray runs with, as an absolute path (login starts it from another folder)."""
    if frozen:
        command = [executable]
    else:
        if platform == "win32":
            path = PureWindowsPath(executable)
            if path.name.lower() == "python.exe":
                executable = str(path.with_name("pythonw.exe"))
        command = [executable, "-m", "app"]
    if config_file is not None:
        command += ["tray", "--config", str(config_file.absolute())]
    return command


def split_command(line: str) -> list[str]:
    """A command line as Windows' CommandLineToArgvW splits it (what
    `subprocess.list2cmdline` writes): blanks separate arguments outside double quotes;
    2n backslashes before a quote are n and the quote delimits, 2n+1 are n and a
    literal quote; other backslashes are themselves."""
    args: list[str] = []
    current, quoted, started, slashes = "", False, False, 0
    for char in line:
        if char == "\\":
            slashes += 1
            continue
        if char == '"':
            current += "\\" * (slashes // 2) + ('"' if slashes % 2 else "")
            quoted = quoted if slashes % 2 else not quoted
        elif char in " \t" and not quoted:
            if started or slashes:
                args.append(current + "\\" * slashes)
            current, started, slashes = "", False, 0
            continue
        else:
            current += "\\" * slashes + char
        slashes, started = 0, True
    if started or slashes:
        args.append(current + "\\" * slashes)
    return args


def points_elsewhere(registered: list[str], ours: list[str], exists: Callable[[str], bool]) -> bool:
    """Whether an entry that starts `registered` should be written again as `ours`: it is
    not ours, and either its program is gone (a folder moved or deleted) or it is our
    program with other arguments (another config). Pure; `exists` looks at the disk."""
    if not registered or registered == ours:
        return False
    same_program = registered[0].lower() == ours[0].lower()
    return same_program or not exists(registered[0])


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
            self._write_desktop_file()
        else:
            self.desktop_file.unlink(missing_ok=True)

    def registered(self) -> list[str] | None:
        """The command the entry starts, as written; None without an entry."""
        if self.registry is not None:
            value = self.registry.read(RUN_KEY, VALUE_NAME)
            return split_command(value) if isinstance(value, str) else None
        if not self.desktop_file.is_file():
            return None
        text = self.desktop_file.read_text(encoding="utf-8", errors="replace")
        lines = [line for line in text.splitlines() if line.startswith("Exec=")]
        return split_command(lines[0].removeprefix("Exec=")) if lines else []

    def repair(self, exists: Callable[[str], bool] = lambda p: Path(p).exists()) -> bool:
        """Writes the entry again where it points elsewhere (`points_elsewhere`), leaving
        whether Windows runs it (Task Manager's flag) as the person set it; whether it did."""
        registered = self.registered()
        if registered is None or not points_elsewhere(registered, self.command, exists):
            return False
        log.info("start at login pointed at %s; now %s", registered, self.command)
        try:
            if self.registry is not None:
                self.registry.write(RUN_KEY, VALUE_NAME, subprocess.list2cmdline(self.command))
            else:
                self._write_desktop_file()
        except OSError as exc:  # the tray starts all the same
            log.warning("start at login could not be written again: %s", exc)
            return False
        return True

    def _write_desktop_file(self) -> None:
        self.desktop_file.parent.mkdir(parents=True, exist_ok=True)
        self.desktop_file.write_text(
            "[Desktop Entry]\nType=Application\nName=vramgate\n"
            "Comment=Local GPU inference server\n"
            f"Exec={subprocess.list2cmdline(self.command)}\n"
            "X-GNOME-Autostart-enabled=true\n",
            encoding="utf-8",
        )
