"""The tray's menu never blocks the icon's thread: with a server that accepts connections
and never answers (a real loopback socket), every item's action returns within 100 ms,
and what it asked for (a pause, a drain and quit) still happens off that thread.

Before, "Pause new requests" posted with a 60 s timeout and Quit drained for up to 30 s
on the icon's thread: Windows shows such a tray as not responding, and a logoff waits
on it."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.live import wait_until
from tray.autostart import Autostart
from tray.menu import Item, TrayActions, build_menu
from tray.supervisor import Supervisor
from tray.view import IconView, ModelLine, TrayView

# A callback that hands its work to a thread returns in well under a millisecond here;
# 100 ms (the bound) leaves a 2-core CI machine busy with other tests a wide
# margin, while a blocking call (a 3 s, 60 s or drain-long wait) is far past it.
CALLBACK_S = 0.1


class StalledServer:
    """A loopback port that accepts every connection and never reads or answers."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed at the end
            while True:
                self.accepted.append(self.listener.accept()[0])

    def close(self) -> None:
        self.listener.close()
        for connection in self.accepted:
            connection.close()


class FakeIcon:
    def __init__(self) -> None:
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()


@pytest.fixture
def stalled() -> Iterator[StalledServer]:
    server = StalledServer()
    yield server
    server.close()


def actions_of(items: tuple[Item, ...]) -> list[Item]:
    found = []
    for item in items:
        found += actions_of(item.submenu) if item.submenu else [item] if item.action else []
    return found


@pytest.mark.slow
def test_every_menu_action_returns_at_once_with_a_server_that_never_answers(
    stalled: StalledServer, tmp_path: Path
) -> None:
    supervisor = Supervisor(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        log_dir=tmp_path / "log",
        pid_file=tmp_path / "pid",
        shutdown_url=stalled.url + "/admin/shutdown",  # never answers: a 3 s wait, then a signal
    )
    supervisor.start()
    wait_until(lambda: supervisor.state == "running", 10, "the stand-in server running")
    opened: list[object] = []
    actions = TrayActions(
        stalled.url,
        supervisor,
        tmp_path / "log",
        autostart=Autostart(["vramgate"], config_dir=tmp_path),
        open_url=opened.append,
        open_path=opened.append,
    )
    view = TrayView(
        IconView("ready", 0.0, 0),
        "ready",
        models=(ModelLine("ready-model", "ready", 2**20), ModelLine("idle", "unloaded", 2**20)),
    )
    items = actions_of(build_menu(view, actions))
    texts = [item.text.split(" (")[0] for item in items]
    assert texts[-1] == "Quit" and {"Pause new requests", "Restart server", "Unload"} <= set(texts)
    icon = FakeIcon()
    took = {}
    for text, item in zip(texts, items, strict=True):
        started = time.perf_counter()
        assert item.action is not None
        item.action(icon)
        took[text] = time.perf_counter() - started
    assert max(took.values()) < CALLBACK_S, took
    # what Quit asked for happened, off the icon's thread: the server stopped, the icon too
    assert icon.stopped.wait(30)
    assert supervisor.state == "stopped" and len(stalled.accepted) >= 2  # the pause, the drain
