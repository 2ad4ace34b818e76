"""The tray icon under a real X11 tray host (Xvfb + trayer, pystray's xorg backend) stays
docked, drawn and current: sampled from launch until well after the server is ready, and
while views change faster than the monitor ever changes them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx

from tests.support.live import free_port, wait_until
from tests.tray import test_tray_xvfb
from tests.tray.test_tray_xvfb import CONFIG, Desktop, desktop  # noqa: F401 (a fixture)
from tray.icon import BACKGROUND

pytestmark = test_tray_xvfb.pytestmark  # slow; needs Xvfb, trayer, xdotool, imagemagick
REPO = Path(__file__).resolve().parents[2]
READY = "VRAM 0.0 / 8.0 GiB · 0 running · 0 waiting"


def icon_windows(screen: Desktop) -> list[str]:
    return subprocess.run(
        ["xdotool", "search", "--class", "^vramgate$"],
        env=screen.env,
        capture_output=True,
        text=True,
    ).stdout.split()


def geometry(screen: Desktop, window: str) -> tuple[int, int]:
    out = subprocess.run(
        ["xdotool", "getwindowgeometry", window], env=screen.env, capture_output=True, text=True
    ).stdout.split()
    width, height = out[-1].split("x") if out else ("0", "0")
    return int(width), int(height)


def tile_pixels(screen: Desktop, window: str) -> int:
    """Pixels of the icon's tile colour in the icon's window: 0 when nothing is drawn."""
    shot = screen.screenshot()
    x, y = (
        int(v)
        for v in subprocess.run(
            ["xdotool", "getwindowgeometry", "--shell", window],
            env=screen.env,
            capture_output=True,
            text=True,
        )
        .stdout.split("X=")[1]
        .replace("Y=", "")
        .split()[:2]
    )
    width, height = geometry(screen, window)
    crop = shot.crop((x, y, x + width, y + height))
    tile = BACKGROUND[:3]
    near = (max(abs(a - b) for a, b in zip(c, tile, strict=True)) for c in crop.getdata())
    return sum(1 for distance in near if distance <= 8)


def load(url: str, seconds: float) -> None:
    """Requests one after another, a few at a time: the icon changes at every poll."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        batch = [
            threading.Thread(
                target=httpx.post,
                args=(url + "/v1/embeddings",),
                kwargs={"json": {"model": "sim", "input": "x"}, "timeout": 60},
            )
            for _ in range(2)
        ]
        for thread in batch:
            thread.start()
        for thread in batch:
            thread.join()


def test_the_icon_stays_docked_drawn_and_current_from_launch_until_15s_after_ready(
    desktop,  # noqa: F811
    tmp_path,
):
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(CONFIG.format(port=port, tmp=tmp_path).replace("1500", "700"))
    url = f"http://127.0.0.1:{port}"
    tray = subprocess.Popen(
        [sys.executable, "-m", "app", "tray", "--config", str(config)],
        env=desktop.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    samples: list[tuple[float, tuple[int, int], int]] = []
    ready_at = None
    loader = None
    try:
        start = time.monotonic()
        while ready_at is None or time.monotonic() - ready_at < 15:
            assert time.monotonic() - start < 120, "the server never became ready"
            if ready_at is None and _healthy(url):
                ready_at = time.monotonic()
                loader = threading.Thread(target=load, args=(url, 10), daemon=True)
                loader.start()
            windows = icon_windows(desktop)
            if windows:
                window = windows[0]
                at = time.monotonic() - start
                samples.append((at, geometry(desktop, window), tile_pixels(desktop, window)))
            time.sleep(0.5)
        if loader is not None:
            loader.join(60)
        # The title follows the server once the load is over: the tray is still answering.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not desktop.title().startswith(READY):
            time.sleep(0.2)
        title = desktop.title()
    finally:
        tray.terminate()
        tray.wait(60)
    # Its window appears before the tray host docks it (1x1 until then: under load, for
    # a few samples); from the moment it is docked it must stay docked and drawn.
    docked_at = next((i for i, (_, size, _) in enumerate(samples) if size[0] >= 24), None)
    assert docked_at is not None, f"the icon was never docked: {samples[:3]}"
    assert samples[docked_at][0] < 30, f"docked only at {samples[docked_at][0]:.1f} s"
    samples = samples[docked_at:]
    first = samples[0][1]
    shrunk = [(round(at, 1), size) for at, size, _ in samples if size != first]
    assert shrunk == [], f"the icon's window changed size from {first}: {shrunk}"
    blank = [round(at, 1) for at, _, drawn in samples if drawn < 20]
    assert blank == [], f"the icon was not drawn at {blank} s"
    assert title.startswith(READY), title


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


SHOW_MANY = textwrap.dedent("""
    import faulthandler, sys, threading
    from pathlib import Path
    faulthandler.dump_traceback_later(60, exit=True)  # a deadlock ends with its stacks
    sys.path.insert(0, {repo!r})
    from tray.app import Tray
    from tray.supervisor import Supervisor
    from tray.view import IconView, TrayView

    log = Path({log!r})
    supervisor = Supervisor(["true"], log_dir=log, pid_file=log / "pid")
    tray = Tray("http://127.0.0.1:9", supervisor, log)
    mainloop, foreign = [], []
    protocol = tray.icon._display.display  # every request and flush of the mainloop's X
    original = protocol.send_and_recv      # connection goes through this one method

    def watched(*args, **kwargs):
        if mainloop and threading.current_thread() is not mainloop[0]:
            foreign.append(threading.current_thread().name)
        return original(*args, **kwargs)

    protocol.send_and_recv = watched
    states = ("ready", "busy", "overloaded")

    def views():
        previous = tray.view
        for n in range({count}):
            view = TrayView(IconView(states[n % 3], n % 10 / 10, n % 4), f"VRAM view {{n}}")
            tray.show(view, previous)
            previous = view
        print("shown", {count}, "foreign", len(foreign), sorted(set(foreign)), flush=True)
        tray.icon.stop()

    def setup(icon):
        icon.visible = True
        threading.Thread(target=views, name="monitor").start()

    mainloop.append(threading.main_thread())
    tray.icon.run(setup=setup)
""")


def test_views_shown_from_the_monitors_thread_never_use_the_mainloops_x_connection(
    desktop,  # noqa: F811
    tmp_path,
):
    """pystray's xorg icon sent each update's wake-up over the mainloop's own X
    connection from the monitor's thread; python-xlib then deadlocks now and then (the
    mainloop waits forever for a reply while the monitor waits for the mainloop: the
    icon froze). Here the mainloop's connection has one user, and 300 views are shown."""
    script = SHOW_MANY.format(repo=str(REPO), log=str(tmp_path), count=300)
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=desktop.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "shown 300 foreign 0 []" in done.stdout, done.stdout + done.stderr[-2000:]


SHOW_AND_STAY = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from tray.app import Tray
    from tray.supervisor import Supervisor

    log = Path({log!r})
    tray = Tray("http://127.0.0.1:9", Supervisor(["true"], log_dir=log, pid_file=log / "pid"), log)

    def setup(icon):
        icon.visible = True
        print("shown", flush=True)

    tray.icon.run(setup=setup)
""")


def docked(screen: Desktop, window: str) -> bool:
    """Whether `window` is embedded in a tray host (its parent is not the root window) at
    an icon's size."""
    import Xlib.display

    display = Xlib.display.Display(screen.display)
    try:
        tree = display.create_resource_object("window", int(window)).query_tree()
        return tree.parent.id != tree.root.id and geometry(screen, window)[0] >= 24
    finally:
        display.close()


def test_the_icon_docks_in_a_panel_that_starts_after_it_and_again_when_the_panel_restarts(
    tmp_path,
):
    """A session that starts its programs before its panel, and a desktop shell that
    restarts: pystray's xorg icon docked only when shown (and at once when its host went,
    which is then still gone), so it never came back. Each new tray host announces itself
    and the icon docks in it and is drawn."""
    screen = Desktop(tray_host=False)
    script = SHOW_AND_STAY.format(repo=str(REPO), log=str(tmp_path))
    icon = subprocess.Popen(
        [sys.executable, "-c", script], env=screen.env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert icon.stdout is not None and icon.stdout.readline().strip() == "shown"
        (window,) = icon_windows(screen)
        assert not docked(screen, window)  # no panel yet: the positive control of the next
        screen.start_tray_host()
        wait_until(lambda: docked(screen, window), 20, "docked in the panel that started later")
        wait_until(lambda: tile_pixels(screen, window) > 20, 10, "drawn")
        screen.stop_tray_host()
        wait_until(lambda: not docked(screen, window), 10, "out of the ended panel")
        screen.start_tray_host()
        wait_until(lambda: docked(screen, window), 20, "docked in the restarted panel")
        wait_until(lambda: tile_pixels(screen, window) > 20, 10, "drawn again")
        assert icon.poll() is None
    finally:
        icon.terminate()
        icon.wait(30)
        screen.close()


COUNT_DOCKS = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from tray.app import Tray
    from tray.supervisor import Supervisor

    log = Path({log!r})
    tray = Tray("http://127.0.0.1:9", Supervisor(["true"], log_dir=log, pid_file=log / "pid"), log)
    docks = []
    send = tray.icon._send_message  # every message pystray sends the tray host

    def counted(window, client_type, l0=0, *rest):
        if l0 == tray.icon._SYSTEM_TRAY_REQUEST_DOCK:
            docks.append(time.monotonic())
        return send(window, client_type, l0, *rest)

    tray.icon._send_message = counted

    def setup(icon):
        icon.visible = True
        print("docks", len(docks), flush=True)

    tray.icon.run(setup=setup)
""")


def test_showing_the_icon_asks_the_tray_host_to_dock_it_once(desktop, tmp_path):  # noqa: F811
    """Showing an icon whose image is new docked it twice (the image's update docked it,
    then showing it did again): trayer left the window undocked at 1x1 after 14 of 45
    launches on this machine under load (CI: 'the icon was never docked'); 0 of 45 with
    one request."""
    script = COUNT_DOCKS.format(repo=str(REPO), log=str(tmp_path))
    icon = subprocess.Popen(
        [sys.executable, "-c", script], env=desktop.env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert icon.stdout is not None
        assert icon.stdout.readline().split() == ["docks", "1"]
        (window,) = icon_windows(desktop)
        wait_until(lambda: docked(desktop, window), 20, "docked")
    finally:
        icon.terminate()
        icon.wait(30)
