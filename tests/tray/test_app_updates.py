"""The real tray (pystray's xorg icon under Xvfb + trayer) polling a live server with an
idle model: it redraws its icon and rebuilds its menu only when what they show changes.

pystray's win32 backend rebuilds the whole menu (DestroyMenu + CreatePopupMenu) at each
`update_menu`, on the calling thread, while the icon's thread may be showing that menu
(pystray#60): an idle model's keep-alive countdown made the monitor rebuild it at every
poll, and a VRAM figure that moved by a few bytes redrew the icon."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import httpx

from app.config.settings import ModelSpec, SimulatedBucket
from tests.support.live import wait_until
from tests.tray import test_tray_xvfb
from tests.tray.test_tray_xvfb import desktop  # noqa: F401 (a fixture)

pytestmark = test_tray_xvfb.pytestmark  # slow; needs Xvfb, trayer, xdotool, imagemagick
REPO = Path(__file__).resolve().parents[2]
MiB = 2**20
IDLE = ModelSpec(
    name="idle",
    kind="simulated",
    keep_alive="10m",
    buckets=(SimulatedBucket(size=16, bytes=10 * MiB, run_ms=1),),
)

COUNT_UPDATES = textwrap.dedent("""
    import faulthandler, sys, threading, time
    from pathlib import Path
    faulthandler.dump_traceback_later(60, exit=True)
    sys.path.insert(0, {repo!r})
    from tray.app import Tray
    from tray.supervisor import Supervisor

    log = Path({log!r})
    supervisor = Supervisor(["true"], log_dir=log, pid_file=log / "pid")
    supervisor.state = "running"  # the server is the test's, not this supervisor's
    tray = Tray({url!r}, supervisor, log)
    icon = tray.icon
    updates = []  # (what, thread name): every menu rebuild and icon redraw

    def counted(what, original):
        def inner(*args, **kwargs):
            updates.append((what, threading.current_thread().name))
            return original(*args, **kwargs)
        return inner

    icon._update_menu = counted("menu", icon._update_menu)
    icon._update_icon = counted("icon", icon._update_icon)

    def polls():
        tray.monitor.poll()
        time.sleep(0.5)
        after_first = len(updates)
        for _ in range(10):
            time.sleep(0.3)
            tray.monitor.poll()
        later = updates[after_first:]
        print("first", after_first, "later", len(later), later, flush=True)
        print("label", [m for m in tray.view.models], flush=True)
        icon.stop()

    def setup(icon):
        icon.visible = True
        threading.Thread(target=polls, name="monitor").start()

    icon.run(setup=setup)
""")


def test_an_idle_model_costs_no_menu_or_icon_update_after_the_first_poll(
    desktop,  # noqa: F811
    server_factory,
    tmp_path,
):
    """Over 10 polls of an idle model counting down its keep-alive, while the device's
    used memory moves by a few KiB (less than one pixel of the gauge): 0 menu rebuilds,
    0 icon redraws after the first poll's."""
    live = server_factory(device="simulated:1GiB", models=(IDLE,))
    httpx.post(live.url + "/v1/embeddings", json={"model": "idle", "input": "x"}, timeout=30)
    wait_until(lambda: live.status()["models"][0]["unloads_in_s"] is not None, 30, "idle")
    stop = threading.Event()

    def jitter() -> None:  # other programs' memory moving a little, as on a real GPU
        n = 0
        while not stop.is_set():
            n += 1
            live.service.device.set_external(200 * MiB + (n % 7) * 4096)
            live.service.memory.snapshot(fresh=True)
            stop.wait(0.05)

    mover = threading.Thread(target=jitter, daemon=True)
    mover.start()
    try:
        script = COUNT_UPDATES.format(repo=str(REPO), log=str(tmp_path), url=live.url)
        done = subprocess.run(
            [sys.executable, "-c", script],
            env=desktop.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        stop.set()
        mover.join()
    out = done.stdout + done.stderr[-2000:]
    first = next(line for line in done.stdout.splitlines() if line.startswith("first"))
    assert int(first.split()[1]) >= 1, out  # the first poll draws the icon and the menu
    assert first.split()[2:4] == ["later", "0"], out
