"""The real tray process on a virtual display with a real tray host (trayer), running a
real server child with the simulated device."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image

from tests.support.live import clean_env, free_port, wait_until
from tray.icon import COLOURS

TOOLS = ("Xvfb", "trayer", "xdotool", "import")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(shutil.which(t) for t in TOOLS), reason="needs Xvfb, trayer, xdotool, imagemagick"
    ),
]
DOCS = Path(__file__).resolve().parents[2] / "docs"
CONFIG = """
device = "simulated:8GiB"
port = {port}
max_concurrent = 1
data_dir = "{tmp}/data"
log_dir = "{tmp}/log"
[[models]]
name = "sim"
kind = "simulated"
buckets = [{{size = 16, bytes = "3GiB", run_ms = 1500}}]
"""


class Desktop:
    """Xvfb plus trayer: a display with a system tray (`tray_host=False`: none yet, as a
    session whose panel starts after its programs; `start_tray_host` starts it)."""

    def __init__(self, tray_host: bool = True) -> None:
        self.xvfb = subprocess.Popen(
            ["Xvfb", "-displayfd", "1", "-screen", "0", "480x96x24", "-nolisten", "tcp"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.display = ":" + self.xvfb.stdout.readline().strip()
        self.env = clean_env() | {"DISPLAY": self.display, "PYSTRAY_BACKEND": "xorg"}
        self.trayer: subprocess.Popen[bytes] | None = None
        if tray_host:
            self.start_tray_host()

    def start_tray_host(self) -> None:
        self.trayer = subprocess.Popen(
            [
                "trayer",
                "--edge",
                "top",
                "--align",
                "right",
                "--widthtype",
                "request",
                "--height",
                "64",
                "--transparent",
                "false",
                "--tint",
                "0x202830",
                "--SetDockType",
                "true",
            ],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait_for_the_tray_host()

    def stop_tray_host(self) -> None:
        """The panel ends (a desktop restarting its shell): the selection has no owner."""
        assert self.trayer is not None
        self.trayer.terminate()
        self.trayer.wait(10)
        self.trayer = None

    def _wait_for_the_tray_host(self) -> None:
        """Until trayer owns the system tray selection, as a desktop's panel does before
        its programs start (the tests of a panel that starts later say so)."""
        import Xlib.display  # python-xlib comes with pystray on Linux only
        import Xlib.X

        assert self.trayer is not None
        display = Xlib.display.Display(self.display)
        try:
            selection = display.intern_atom(f"_NET_SYSTEM_TRAY_S{display.get_default_screen()}")
            deadline = time.monotonic() + 30
            while display.get_selection_owner(selection) == Xlib.X.NONE:
                assert self.trayer.poll() is None, f"trayer ended: {self.trayer.returncode}"
                assert time.monotonic() < deadline, "trayer never took the system tray"
                time.sleep(0.05)
        finally:
            display.close()

    def titles(self) -> list[str]:
        found = subprocess.run(
            ["xdotool", "search", "--name", "^(VRAM|vramgate)"],
            env=self.env,
            capture_output=True,
            text=True,
        ).stdout.split()
        names = []
        for window in found:
            raw = subprocess.run(
                ["xdotool", "getwindowname", window], env=self.env, capture_output=True
            ).stdout
            names.append(raw.decode("latin-1").strip())  # pystray sets a Latin-1 WM_NAME
        return names

    def title(self) -> str:
        titles = self.titles()
        return titles[0] if titles else ""

    def screenshot(self) -> Image.Image:
        png = subprocess.run(
            ["import", "-window", "root", "png:-"], env=self.env, capture_output=True, check=True
        ).stdout
        return Image.open(io.BytesIO(png)).convert("RGB")

    def close(self) -> None:
        for process in (self.trayer, self.xvfb):
            if process is not None:
                process.terminate()
                process.wait(10)


def colour_pixels(image: Image.Image, state: str) -> int:
    colour = COLOURS[state][:3]
    width, height = image.size
    return sum(1 for y in range(height) for x in range(width) if image.getpixel((x, y)) == colour)


def servers_for(config: Path) -> list[str]:
    out = subprocess.run(
        ["pgrep", "-f", f"app serve --config {config}"], capture_output=True, text=True
    ).stdout
    return out.split()


@pytest.fixture
def desktop():
    screen = Desktop()
    yield screen
    screen.close()


def test_real_tray_shows_live_figures_survives_a_killed_server_and_stays_single(
    desktop, tmp_path, request
):
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(CONFIG.format(port=port, tmp=tmp_path))
    url = f"http://127.0.0.1:{port}"
    tray = subprocess.Popen(
        [sys.executable, "-m", "app", "tray", "--config", str(config)],
        env=desktop.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # Our icon appears, ready, with the figures in its title.
        # (while starting, the readiness probe's title shares the figures' prefix)
        ready = "VRAM 0.0 / 8.0 GiB · 0 running · 0 waiting"
        wait_until(lambda: desktop.title() == ready, 90, "ready title")
        # the title and the image are two X requests: under load the image lags a moment
        drawn = lambda: colour_pixels(desktop.screenshot(), "ready") > 20  # noqa: E731
        wait_until(drawn, 10, "the ready icon drawn")

        # Live figures: a long job runs and two wait.
        load = [
            threading.Thread(
                target=httpx.post,
                args=(url + "/v1/embeddings",),
                kwargs={"json": {"model": "sim", "input": "x"}, "timeout": 60},
            )
            for _ in range(3)
        ]
        for thread in load:
            thread.start()
        wait_until(lambda: "1 running · 2 waiting" in desktop.title(), 20, "busy title")
        assert desktop.title() == "VRAM 3.0 / 8.0 GiB · 1 running · 2 waiting"
        busy = desktop.screenshot()
        assert colour_pixels(busy, "busy") > 20
        if request.config.getoption("--update-docs"):
            crop = busy.crop((busy.width - 80, 0, busy.width, 64))
            crop.resize((crop.width * 3, crop.height * 3), Image.NEAREST).save(DOCS / "tray.png")
        for thread in load:
            thread.join()

        # A second start finds the first, opens its dashboard and leaves one server.
        opened = tmp_path / "opened.txt"
        browser = tmp_path / "browser"
        browser.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> {opened}\n')
        browser.chmod(0o755)
        second = subprocess.run(
            [sys.executable, "-m", "app", "tray", "--config", str(config)],
            env=desktop.env | {"BROWSER": str(browser)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 0 and "already running" in second.stderr
        assert opened.read_text().split() == [url + "/dashboard"]
        assert len(servers_for(config)) == 1

        # The server is killed; the supervisor brings it back and the icon says so.
        pid = int((tmp_path / "data" / "server.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: "restart" in desktop.title(), 10, "restart shown")
        back = "VRAM 0.0 / 8.0 GiB · 0 running · 0 waiting · restarts 1"
        wait_until(lambda: desktop.title() == back, 90, "ready again after the restart")
        new_pid = int((tmp_path / "data" / "server.pid").read_text())
        assert new_pid != pid and httpx.get(url + "/health").status_code == 200
    finally:
        tray.send_signal(signal.SIGTERM)  # as Quit: drains and stops the server
        code = tray.wait(60)
    assert code == 0
    time.sleep(0.5)
    assert servers_for(config) == []


def fake_notify_send(tmp_path: Path, env: dict[str, str]) -> tuple[dict[str, str], Path]:
    """`notify-send` as a script that records what it was asked to show (no notification
    daemon runs here), first on PATH."""
    shown = tmp_path / "shown.txt"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "notify-send"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> {shown}\n')
    fake.chmod(0o755)
    return env | {"PATH": f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"}, shown


def test_tray_refuses_a_port_that_is_taken_and_tells_the_person(desktop, tmp_path):
    """Issue 29, 16: a double-click while another program has the port ended the tray
    with 74 and a log line only; the person now gets a message saying which port."""
    import socket

    env, shown = fake_notify_send(tmp_path, desktop.env)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "config.toml"
        config.write_text(CONFIG.format(port=port, tmp=tmp_path))
        result = subprocess.run(
            [sys.executable, "-m", "app", "tray", "--config", str(config)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 74
    assert "already in use" in result.stderr
    assert servers_for(config) == []
    assert shown.exists(), "no message was shown"
    message = shown.read_text()
    assert message.startswith("--urgency=critical\nvramgate\nvramgate cannot start: port ")
    assert f"port {port} on 127.0.0.1 is in use by another program" in message
    assert str(config) in message


def test_a_port_taken_after_the_icon_is_up_is_told_and_ends_the_tray(desktop, tmp_path):
    """The port is free when the tray looks, then another program takes it before the
    server binds: the server exits 74 at its first start, which is not retried; the
    tray says so (pystray's X11 icon has no notifications: through notify-send) and
    ends with 74."""
    import socket

    env, shown = fake_notify_send(tmp_path, desktop.env)
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(CONFIG.format(port=port, tmp=tmp_path))
    tray = subprocess.Popen(
        [sys.executable, "-m", "app", "tray", "--config", str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with socket.socket() as taken:
        try:
            wait_until(lambda: desktop.title().startswith("vramgate"), 30, "the icon")
            taken.bind(("127.0.0.1", port))  # before the server child binds (seconds later)
            taken.listen()
            code = tray.wait(60)
        finally:
            if tray.poll() is None:
                tray.kill()
                tray.wait()
    assert code == 74
    assert shown.exists(), "no message was shown"
    message = shown.read_text()
    assert "vramgate\nThe port is in use by another program; vramgate stops." in message
