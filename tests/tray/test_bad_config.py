"""A bad config ends the tray with exit code 2, after telling the person: a message box
on Windows, a desktop notification elsewhere, and the tray's log. Here `notify-send` is
a stand-in script that records what it was asked to show (no notification daemon runs
on this machine); the tray runs as its own process, as a double-click starts it."""

from __future__ import annotations

import subprocess
import sys

from tests.support.live import clean_env


def test_a_bad_config_is_shown_and_logged_and_ends_the_tray_with_2(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("port = 'not a port'\n")
    shown = tmp_path / "shown.txt"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "notify-send"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {shown}\n')
    fake.chmod(0o755)
    env = clean_env() | {
        "HOME": str(tmp_path),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "PATH": f"{bin_dir}:/usr/bin:/bin",
    }
    env.pop("DISPLAY", None)
    done = subprocess.run(
        [sys.executable, "-m", "app", "tray", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    message = shown.read_text()
    assert message.startswith("--urgency=critical\nvramgate\nvramgate cannot start:")
    assert str(config) in message and "port" in message
    logs = list(tmp_path.rglob("tray.log"))
    assert logs and "the config" in logs[0].read_text() and "is invalid" in logs[0].read_text()
