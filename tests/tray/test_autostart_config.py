"""Start at login keeps the tray's config and is written again when it points elsewhere,
checked on what it writes: the Run value's command line (an in-memory HKCU: winreg cannot
run here) and the XDG entry's Exec line, read back as Windows and a desktop split them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path, PureWindowsPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.tray.test_autostart import DISABLED_BY_TASK_MANAGER, InMemoryRegistry
from tray.autostart import (
    APPROVED_KEY,
    RUN_KEY,
    VALUE_NAME,
    Autostart,
    points_elsewhere,
    split_command,
    tray_command,
)

INSTALLED = r"C:\Users\Ann Lee\AppData\Local\Programs\vramgate\vramgate.exe"
CONFIG = PureWindowsPath(r"C:\Users\Ann Lee\vramgate work\config.toml")


def windows_command(config: PureWindowsPath | None = CONFIG) -> list[str]:
    return [INSTALLED, "tray", "--config", str(config)] if config else [INSTALLED]


def test_the_tray_command_carries_its_config_as_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    command = tray_command(INSTALLED, frozen=True, platform="win32", config_file=Path("my.toml"))
    assert command == [INSTALLED, "tray", "--config", str(tmp_path / "my.toml")]
    assert tray_command(INSTALLED, frozen=True, platform="win32") == [INSTALLED]


def test_the_run_value_starts_the_tray_with_its_config():
    registry = InMemoryRegistry()
    Autostart(windows_command(), registry=registry).set(True)
    value = registry.values[(RUN_KEY, VALUE_NAME)]
    assert value == f'"{INSTALLED}" tray --config "{CONFIG}"'  # what Windows runs at login
    assert isinstance(value, str) and split_command(value) == windows_command()


@pytest.mark.parametrize(
    ("registered", "repaired"),
    [
        # a folder moved or deleted since: its program is gone
        ([r"D:\old place\vramgate\vramgate.exe"], True),
        # this program, with the config it was started with once (or none)
        (windows_command(None), True),
        (windows_command(PureWindowsPath(r"C:\elsewhere\config.toml")), True),
        # already ours
        (windows_command(), False),
        # another copy of vramgate that is still there: its own entry
        ([r"C:\dev\vramgate\.venv\Scripts\pythonw.exe", "-m", "app"], False),
    ],
)
def test_an_entry_pointing_elsewhere_is_written_again(registered, repaired):
    registry = InMemoryRegistry()
    registry.values[(RUN_KEY, VALUE_NAME)] = subprocess.list2cmdline(registered)
    existing = {INSTALLED, r"C:\dev\vramgate\.venv\Scripts\pythonw.exe"}
    autostart = Autostart(windows_command(), registry=registry)
    assert autostart.repair(exists=existing.__contains__) is repaired
    value = registry.values[(RUN_KEY, VALUE_NAME)]
    assert isinstance(value, str)
    assert split_command(value) == (windows_command() if repaired else registered)


def test_a_repair_keeps_task_managers_switch_and_never_switches_on():
    registry = InMemoryRegistry()
    registry.values[(RUN_KEY, VALUE_NAME)] = r'"D:\moved\vramgate.exe"'
    registry.values[(APPROVED_KEY, VALUE_NAME)] = DISABLED_BY_TASK_MANAGER
    autostart = Autostart(windows_command(), registry=registry)
    assert autostart.repair(exists=lambda _: False)
    assert registry.values[(APPROVED_KEY, VALUE_NAME)] == DISABLED_BY_TASK_MANAGER
    assert not autostart.enabled()
    off = Autostart(windows_command(), registry=InMemoryRegistry())
    assert not off.repair(exists=lambda _: False) and not off.enabled()  # no entry: none made


@pytest.mark.skipif(sys.platform == "win32", reason="the XDG entry; Windows uses the Run key")
def test_the_xdg_entry_keeps_the_config_and_is_repaired(tmp_path):
    config = tmp_path / "work" / "config.toml"
    moved = Autostart(["/opt/old/vramgate"], config_dir=tmp_path)
    moved.set(True)
    here = str(tmp_path / "vramgate")
    ours = Autostart(
        tray_command(here, frozen=True, platform="linux", config_file=config), config_dir=tmp_path
    )
    assert ours.repair()  # /opt/old/vramgate does not exist
    exec_line = [x for x in ours.desktop_file.read_text().splitlines() if x.startswith("Exec=")]
    assert split_command(exec_line[0].removeprefix("Exec=")) == [
        here,
        "tray",
        "--config",
        str(config),
    ]
    assert not ours.repair()  # ours now


def test_points_elsewhere_compares_the_program_case_blind_as_windows_does():
    ours = windows_command()
    assert not points_elsewhere([], ours, lambda _: False)
    assert points_elsewhere([INSTALLED.upper()], ours, lambda _: True)


@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"))))
def test_split_command_reads_back_what_list2cmdline_writes(args):
    assert split_command(subprocess.list2cmdline(args)) == args
