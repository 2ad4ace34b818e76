"""One tray per user: a second process cannot take the lock while the first holds it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tray.single_instance import acquire


def other_process_gets_the_lock(lock_dir) -> bool:
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from tray.single_instance import acquire
        sys.exit(0 if acquire(Path({str(lock_dir)!r})) else 1)
    """)
    return subprocess.run([sys.executable, "-c", script], timeout=60).returncode == 0


def test_second_instance_is_refused_until_the_first_lets_go(tmp_path):
    lock = acquire(tmp_path)
    assert lock is not None
    assert not other_process_gets_the_lock(tmp_path)
    lock.release()
    assert other_process_gets_the_lock(tmp_path)


def test_a_dead_holder_never_blocks_the_next_start(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time; from pathlib import Path; from tray.single_instance import acquire; "
            f"lock = acquire(Path({str(tmp_path)!r})); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    assert acquire(tmp_path) is None
    holder.kill()
    holder.wait()
    assert acquire(tmp_path) is not None


def test_the_windows_mutex_is_named_after_the_data_folder():
    """Issue 41, 4: the mutex was `Local\\vramgate-tray` whatever the data folder (one tray
    per logon session, where Linux allows one per data folder). The name is a hash of
    the folder as Windows compares paths: case and separators do not matter."""
    from tray.single_instance import mutex_name

    same = (
        r"C:\Users\Ada\AppData\Local\vramgate",
        r"c:\users\ada\appdata\local\VRAMGATE",
        "C:/Users/Ada/AppData/Local/vramgate/",
        r"C:\Users\Ada\AppData\Local\Temp\..\vramgate",
    )
    assert len({mutex_name(path) for path in same}) == 1
    other = mutex_name(r"D:\models\vramgate-data")
    assert other != mutex_name(same[0])
    name = mutex_name(same[0])
    # a name in the session's namespace, no other backslash (CreateMutexW's rules)
    assert name.startswith("Local\\vramgate-tray-") and "\\" not in name.removeprefix("Local\\")
    assert len(name) < 260


def test_a_second_launch_on_the_same_data_folder_opens_the_running_ones_dashboard(tmp_path):
    """Issue 41, 4: a second double-click exited silently (a windowed process has no
    console to say "already running" in). It opens the dashboard of the tray that holds
    the data folder, signed in with the token. Here the browser is a script that records
    what it was asked to open ($BROWSER, which Python's webbrowser honours first)."""
    from tests.support.live import clean_env, free_port

    data = tmp_path / "data"
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(
        f'port = {port}\ntoken = "s3cret"\ndata_dir = "{data}"\nlog_dir = "{tmp_path}/log"\n'
    )
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser"
    browser.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> {opened}\n')
    browser.chmod(0o755)
    env = clean_env() | {"BROWSER": str(browser)}
    env.pop("DISPLAY", None)
    lock = acquire(data)  # the running tray's lock on that data folder
    assert lock is not None
    try:
        second = subprocess.run(
            [sys.executable, "-m", "app", "tray", "--config", str(config)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        lock.release()
    assert second.returncode == 0, second.stderr
    assert "already running" in second.stderr
    assert opened.read_text().split() == [f"http://127.0.0.1:{port}/dashboard?token=s3cret"]
