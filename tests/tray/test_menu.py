"""The tray menu without a display: its items are called with a fake icon object and
really act on a live server."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from app.config.settings import ModelSpec, SimulatedBucket
from tests.support.live import wait_until
from tray.autostart import Autostart
from tray.menu import Item, TrayActions, build_menu
from tray.monitor import fetch_status
from tray.supervisor import Supervisor
from tray.view import view_of

MiB = 2**20
SIM = ModelSpec(
    name="sim", kind="simulated", buckets=(SimulatedBucket(size=16, bytes=10 * MiB, run_ms=1),)
)


class FakeIcon:
    """Stands in for the pystray icon, which needs a display."""

    def __init__(self) -> None:
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


def find(items: tuple[Item, ...], *path: str) -> Item:
    for item in items:
        if item.text.startswith(path[0]):
            return item if len(path) == 1 else find(item.submenu, *path[1:])
    raise KeyError(path)


def actions_for(url: str, tmp_path: Path, **kwargs) -> TrayActions:
    never_started = Supervisor(["true"], log_dir=tmp_path / "log", pid_file=tmp_path / "pid")
    return TrayActions(
        url,
        never_started,
        tmp_path / "log",
        autostart=Autostart(["vramgate"], config_dir=tmp_path),
        **kwargs,
    )


def menu(url: str, actions: TrayActions) -> tuple[Item, ...]:
    return build_menu(view_of(fetch_status(url)), actions)


def test_pause_item_makes_the_server_refuse_and_resume_undoes_it(server_factory, tmp_path):
    live = server_factory(device="simulated:1GiB", models=(SIM,))
    actions = actions_for(live.url, tmp_path)
    icon = FakeIcon()
    pause = find(menu(live.url, actions), "Pause new requests")
    assert pause.checked is False
    pause.action(icon)  # posts off the icon's thread (test_menu_never_blocks.py)
    wait_until(lambda: live.status()["paused"], 10, "paused")
    refused = httpx.post(live.url + "/v1/embeddings", json={"model": "sim", "input": "x"})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "paused"
    resume = find(menu(live.url, actions), "Pause new requests")
    assert resume.checked is True
    resume.action(icon)
    wait_until(lambda: not live.status()["paused"], 10, "resumed")
    ok = httpx.post(live.url + "/v1/embeddings", json={"model": "sim", "input": "x"})
    assert ok.status_code == 200


def test_unload_item_frees_the_models_memory_in_status(server_factory, tmp_path):
    live = server_factory(device="cpu")
    actions = actions_for(live.url, tmp_path)
    before = live.status()
    items = menu(live.url, actions)
    model = find(items, "Models", "all-MiniLM-L6-v2")
    assert "MiB, ready" in model.text
    assert find(model.submenu, "Load").enabled is False
    find(model.submenu, "Unload").action(FakeIcon())
    wait_until(lambda: live.status()["models"][0]["state"] == "unloaded", 30, "unloaded")
    after = live.status()
    assert after["models"][0]["weights_bytes"] == 0
    assert after["device"]["used_by_us_bytes"] < before["device"]["used_by_us_bytes"]
    reload = find(menu(live.url, actions), "Models", "all-MiniLM-L6-v2", "Load")
    assert reload.enabled
    reload.action(FakeIcon())
    wait_until(lambda: live.status()["models"][0]["state"] == "ready", 60, "loaded again")


def test_models_menu_gives_each_models_memory_state_and_keep_alive_left(server_factory, tmp_path):
    idle = ModelSpec(
        name="idle", kind="simulated", weights=300 * MiB, keep_alive="10m", buckets=SIM.buckets
    )
    forever = ModelSpec(name="forever", kind="simulated", load="startup", buckets=SIM.buckets)
    live = server_factory(device="simulated:1GiB", models=(idle, forever))
    wait_until(lambda: live.status()["models"][0]["state"] == "ready", 30, "idle loaded")
    items = menu(live.url, actions_for(live.url, tmp_path))
    label = find(items, "Models", "idle").text
    assert label.startswith("idle (300 MiB, ready, unloads at ") and label.endswith(")")
    shown = label.rsplit(" ", 1)[1].removesuffix(")")  # HH:MM, 10 minutes from now
    in_10 = [time.strftime("%H:%M", time.localtime(time.time() + s)) for s in (540, 600, 660)]
    assert shown in in_10, (shown, in_10)
    assert find(items, "Models", "forever").text == "forever (ready)"  # keep_alive -1


def test_open_items_and_start_at_login(tmp_path):
    opened: list[object] = []
    actions = actions_for(
        "http://127.0.0.1:8450", tmp_path, open_url=opened.append, open_path=opened.append
    )
    items = build_menu(view_of(None), actions)
    find(items, "Open dashboard").action(FakeIcon())
    find(items, "Open API docs").action(FakeIcon())
    find(items, "Open logs folder").action(FakeIcon())
    models = find(items, "Models").submenu
    find(models, "Find a model that fits this GPU…").action(FakeIcon())
    assert opened == [
        "http://127.0.0.1:8450/dashboard",
        "http://127.0.0.1:8450/docs",
        tmp_path / "log",
        "http://127.0.0.1:8450/dashboard#library-section",  # the dashboard's Library
    ]
    login = find(items, "Start at login")
    assert login.checked is False  # opt-in: off by default
    login.action(FakeIcon())
    assert find(build_menu(view_of(None), actions), "Start at login").checked is True


def test_with_a_token_the_pages_open_signed_in(server_factory, tmp_path):
    secret = "tray-token/with+odd&chars"
    live = server_factory(device="simulated:1GiB", models=(SIM,), token=secret)
    opened: list[str] = []
    actions = actions_for(live.url, tmp_path, open_url=opened.append, token=lambda: secret)
    items = build_menu(view_of(None), actions)
    find(items, "Open dashboard").action(FakeIcon())
    find(items, "Open API docs").action(FakeIcon())
    with httpx.Client(follow_redirects=True) as browser:  # does what a browser does
        locations = []
        for address, page in zip(opened, ("/dashboard", "/docs"), strict=True):
            assert address.startswith(live.url + page + "?token=")
            r = browser.get(address)
            assert r.status_code == 200 and r.url.copy_with(fragment=None) == live.url + page
            locations.append(r.history[0].headers["location"])
        # the dashboard takes its session's page key from its address (app.api.page_sessions)
        key = {"X-Vramgate-Page-Key": locations[0].partition("#key=")[2]}
        assert browser.get(live.url + "/status", headers=key).json()["models"][0]["name"] == "sim"


def test_quit_stops_the_server_and_the_icon(tmp_path):
    import sys

    supervisor = Supervisor(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        log_dir=tmp_path / "log",
        pid_file=tmp_path / "pid",
    )
    supervisor.start()
    wait_until(lambda: supervisor.state == "running", 10, "running")
    actions = TrayActions("http://127.0.0.1:1", supervisor, tmp_path / "log")
    icon = FakeIcon()
    find(build_menu(view_of(None), actions), "Quit").action(icon)  # drains off its thread
    wait_until(lambda: icon.stopped, 30, "the icon stopped")
    assert supervisor.state == "stopped"
    assert not (tmp_path / "pid").exists()


def test_a_gguf_models_layer_split_is_in_its_menu_line():
    from tray.menu import model_label

    status = {
        "state": "ready",
        "ready": True,
        "device": {"name": "GPU", "total_bytes": 8 * 2**30, "used_bytes": 2**30,
                   "used_by_us_bytes": 2**29, "kind": "cuda", "warnings": []},
        "queue": {"running": 0, "depth": 0, "max": 256},
        "counters": {"served": 0},
        "models": [{"name": "big", "state": "ready", "weights_bytes": 600 * 2**20,
                    "unloads_in_s": None, "split": "48%/52% CPU/GPU"}],
    }  # fmt: skip
    view = view_of(status)
    assert model_label(view.models[0]) == "big (600 MiB, 48%/52% CPU/GPU, ready)"


def test_a_speech_models_menu_line_says_which_way_it_speaks():
    from tray.menu import model_label

    status = {
        "state": "ready",
        "ready": True,
        "device": {"name": "GPU", "total_bytes": 8 * 2**30, "used_bytes": 2**30,
                   "used_by_us_bytes": 2**29, "kind": "cuda", "warnings": []},
        "queue": {"running": 0, "depth": 0, "max": 256},
        "counters": {"served": 0},
        "models": [
            {"name": "mms", "kind": "speech_synthesis", "state": "ready",
             "weights_bytes": 140 * 2**20, "unloads_in_s": None},
            {"name": "whisper", "kind": "speech", "state": "unloaded", "weights_bytes": 0},
            {"name": "minilm", "kind": "embedding", "state": "ready", "weights_bytes": 2**20},
        ],
    }  # fmt: skip
    labels = [model_label(m) for m in view_of(status).models]
    assert labels == [
        "mms (text to speech, 140 MiB, ready)",
        "whisper (speech to text, unloaded)",
        "minilm (1 MiB, ready)",
    ]
