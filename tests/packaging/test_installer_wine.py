"""The Windows installer (packaging/installer.nsi through packaging/build_installer.py),
built with makensis from a stand-in bundle folder and run silently under Wine: what a
person's machine has after installing, upgrading and uninstalling, read from the Wine
prefix's files and its HKEY_CURRENT_USER hive (user.reg, written out when the Wine
server ends: every step waits for it).

Wine's first start creates the prefix (about 10 s here); each installer or uninstaller
run is about 5 s, most of it Wine starting and stopping its services.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from build_installer import app_version, build_installer, bundle_list

from tests.support.live import in_ci

TOOLS = ("makensis", "wine", "wineboot", "wineserver")
UNINSTALL = r"Software\Microsoft\Windows\CurrentVersion\Uninstall\vramgate"
RUN = r"Software\Microsoft\Windows\CurrentVersion\Run"
APPROVED = r"Software\Microsoft\Windows\CurrentVersion\Explorer\StartupApproved\Run"
WINE_STEP_S = 120  # one Wine run and its server's end (about 5 s here)


def tools_or_skip() -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if not missing:
        return
    why = f"{', '.join(missing)} not installed (Debian: apt-get install nsis wine)"
    if in_ci():  # .ci/run installs them: a CI run that never ran the installer is red
        pytest.fail(f"in CI (CI={os.environ['CI']}): {why}")
    pytest.skip(f"outside CI, so skipped: {why}")


def hive(path: Path) -> dict[str, dict[str, str | int | bytes]]:
    """A Wine registry file's keys (as `reg` names them, one backslash) and their string,
    DWORD and (one-line) binary values: the kinds the installer and Task Manager write."""
    keys: dict[str, dict[str, str | int | bytes]] = {}
    values: dict[str, str | int | bytes] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("["):
            values = keys.setdefault(line[1 : line.rindex("]")].replace("\\\\", "\\"), {})
        elif (found := re.match(r'^"((?:[^"\\]|\\.)*)"=(.*)$', line)) is not None:
            name, raw = unescape(found.group(1)), found.group(2)
            if raw.startswith("dword:"):
                values[name] = int(raw.removeprefix("dword:"), 16)
            elif raw.startswith("hex:") and not raw.endswith("\\"):  # one line
                values[name] = bytes.fromhex(raw.removeprefix("hex:").replace(",", ""))
            elif raw.startswith('"'):
                values[name] = unescape(raw[1:-1])
    return keys


def unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


@dataclass
class Wine:
    """A Wine prefix of the test's own, without a display."""

    prefix: Path

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "DISPLAY"}
        # no Mono or Gecko installer prompts while the prefix is created
        return env | {
            "WINEPREFIX": str(self.prefix),
            "WINEDEBUG": "-all",
            "WINEDLLOVERRIDES": "mscoree,mshtml=",
        }

    def run(self, *command: str) -> subprocess.CompletedProcess[str]:
        """`command` under Wine, and Wine's server ended after it (an uninstaller copies
        itself to a temporary folder and runs from there: ended only with the server)."""
        done = subprocess.run(
            ["wine", *command], env=self.env, capture_output=True, text=True, timeout=WINE_STEP_S
        )
        self.settle()
        return done

    def settle(self) -> None:
        subprocess.run(["wineserver", "-w"], env=self.env, check=True, timeout=WINE_STEP_S)

    def boot(self) -> None:
        subprocess.run(
            ["wineboot", "-i"], env=self.env, capture_output=True, check=True, timeout=WINE_STEP_S
        )
        self.settle()

    def user_folder(self) -> Path:
        (found,) = [p for p in (self.prefix / "drive_c" / "users").iterdir() if p.name != "Public"]
        return found

    def windows_path(self, path: Path) -> str:
        return "C:\\" + "\\".join(path.relative_to(self.prefix / "drive_c").parts)

    def registry(self) -> dict[str, dict[str, str | int | bytes]]:
        return hive(self.prefix / "user.reg")


def stand_in_bundle(root: Path) -> Path:
    """What a PyInstaller one-folder bundle looks like at its top (the two executables,
    `_internal`), a few kilobytes of it."""
    bundle = root / "vramgate"
    files = {
        "vramgate.exe": b"MZ the windowed tray",
        "vramgate-cli.exe": b"MZ the console program",
        "_internal/python311.dll": os.urandom(40_000),
        "_internal/torch/lib/c10.dll": os.urandom(30_000),
        "_internal/xllamacpp.libs/ggml base.dll": os.urandom(20_000),  # a space in a name
    }
    for name, data in files.items():
        (bundle / name).parent.mkdir(parents=True, exist_ok=True)
        (bundle / name).write_bytes(data)
    return bundle


def tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture
def wine(tmp_path: Path) -> Iterator[Wine]:
    tools_or_skip()
    found = Wine(tmp_path / "wine")
    found.boot()
    yield found
    subprocess.run(["wineserver", "-k"], env=found.env, check=False, timeout=WINE_STEP_S)


def test_bundle_list_removes_only_the_bundles_own_entries(tmp_path):
    bundle = stand_in_bundle(tmp_path)
    assert bundle_list(bundle).splitlines() == [
        "!macro REMOVE_BUNDLE",
        '  RMDir /r "$INSTDIR\\_internal"',
        '  Delete "$INSTDIR\\vramgate-cli.exe"',
        '  Delete "$INSTDIR\\vramgate.exe"',
        "!macroend",
    ]
    (bundle / "a$b.txt").write_text("x")  # NSIS would read $b as a variable
    with pytest.raises(ValueError, match="NSIS cannot quote"):
        bundle_list(bundle)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_installs_per_user_upgrades_and_uninstalls_keeping_the_models(tmp_path, wine):
    bundle = stand_in_bundle(tmp_path / "dist")
    installer = build_installer(bundle, tmp_path / "assets", flavour="cpu")
    assert installer.name == f"vramgate-{app_version()}-windows-cpu-setup.exe"

    # 1. silent install: the per-user folder, "Apps & features", the Start menu; no autostart
    assert wine.run(str(installer), "/S").returncode == 0
    user = wine.user_folder()
    installed = user / "AppData" / "Local" / "Programs" / "vramgate"
    shortcut = user / "AppData/Roaming/Microsoft/Windows/Start Menu/Programs/vramgate.lnk"
    assert tree(installed) == {**tree(bundle), "uninstall.exe": tree(installed)["uninstall.exe"]}
    assert shortcut.is_file()
    registry = wine.registry()
    entry = registry[UNINSTALL]
    exe = wine.windows_path(installed / "vramgate.exe")
    uninstaller = wine.windows_path(installed / "uninstall.exe")
    assert entry["DisplayName"] == "vramgate" and entry["DisplayVersion"] == app_version()
    assert entry["UninstallString"] == f'"{uninstaller}"'
    assert entry["QuietUninstallString"] == f'"{uninstaller}" /S'
    assert entry["InstallLocation"] == wine.windows_path(installed)
    kib = sum(len(data) for data in tree(installed).values()) // 1024
    assert kib == entry["EstimatedSize"]  # KiB, as "Apps & features" reads it
    assert "vramgate" not in registry.get(RUN, {})  # autostart is off by default

    # 2. an upgrade in place with "Start at login": stale files go, the Run value comes
    (installed / "_internal" / "stale.dll").write_bytes(b"from the version before")
    assert wine.run(str(installer), "/S", "/AUTOSTART").returncode == 0
    assert not (installed / "_internal" / "stale.dll").exists()
    assert wine.registry()[RUN]["vramgate"] == f'"{exe}"'
    # Task Manager switches it off as Windows does, beside the Run value
    flag = "030000000000000000000000"
    approve = ("reg", "add", "HKCU\\" + APPROVED, "/v", "vramgate", "/t", "REG_BINARY", "/d", flag)
    assert wine.run(*approve, "/f").returncode == 0
    assert wine.registry()[APPROVED]["vramgate"] == bytes.fromhex(flag)

    # 3. the person's models, logs and settings, in the app's default folders
    data = user / "AppData" / "Local" / "vramgate"
    kept = {"models/tiny.gguf": b"GGUF", "Logs/tray.log": b"log", "config.toml": b"port = 1"}
    for name, content in kept.items():
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_bytes(content)

    # 4. silent uninstall: everything of the install gone, the person's files kept
    assert wine.run(uninstaller, "/S").returncode == 0
    assert not installed.exists() and not shortcut.exists()
    registry = wine.registry()
    assert UNINSTALL not in registry
    assert "vramgate" not in registry.get(RUN, {})
    assert "vramgate" not in registry.get(APPROVED, {})
    assert tree(data) == kept

    # 5. asked to (/PURGE), the uninstaller removes them too
    assert wine.run(str(installer), "/S").returncode == 0
    assert wine.run(uninstaller, "/S", "/PURGE").returncode == 0
    assert not installed.exists() and not data.exists()
