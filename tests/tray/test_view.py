"""The tray's view of a /status document: state, gauge, tooltip, menu lines."""

from __future__ import annotations

import copy

import pytest

from tray.view import view_of

GiB = 2**30
STATUS = {
    "state": "ready",
    "paused": False,
    "device": {
        "name": "RTX 4090",
        "total_bytes": 24 * GiB,
        "used_bytes": int(6.1 * GiB),
        "used_by_us_bytes": 2 * GiB,
    },
    "queue": {"depth": 5, "max": 256, "running": 2},
    "counters": {"served": 42},
    "models": [{"name": "m", "state": "ready", "weights_bytes": 90 * 2**20}],
}


def status(**changes):
    doc = copy.deepcopy(STATUS)
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            doc[section][field] = value
        else:
            doc[section] = value
    return doc


def test_tooltip_gives_the_figures():
    view = view_of(STATUS)
    assert view.tooltip == "VRAM 6.1 / 24.0 GiB · 2 running · 5 waiting"
    assert view.icon.queued == 5
    assert view.icon.vram_fraction == pytest.approx(6.1 / 24, abs=0.5 / 51)  # to a pixel
    assert view.lines[0] == "Busy on RTX 4090" and view.models[0].name == "m"


STATE_TABLE = [
    (status(queue__depth=0, queue__running=0), {}, "ready"),
    (STATUS, {}, "busy"),
    (status(queue__depth=210), {}, "overloaded"),
    (status(queue__depth=0, queue__running=0), {"queue_full_delta": 3}, "overloaded"),
    (status(paused=True), {}, "paused"),
    (status(state="failed"), {}, "error"),
    (status(state="warming"), {}, "starting"),
    (None, {}, "starting"),
    (None, {"supervisor_state": "gave_up", "supervisor_message": "port 8450 in use"}, "error"),
]


@pytest.mark.parametrize(("doc", "kwargs", "state"), STATE_TABLE)
def test_state_table(doc, kwargs, state):
    assert view_of(doc, **kwargs).icon.state == state


def test_the_tooltip_says_how_many_of_those_waiting_are_background_work():
    doc = copy.deepcopy(STATUS)
    doc["queue"]["by_class"] = {
        "priority": {"waiting": 0, "oldest_wait_s": 0.0},
        "interactive": {"waiting": 1, "oldest_wait_s": 0.2},
        "background": {"waiting": 4, "oldest_wait_s": 31.0},
    }
    assert view_of(doc).tooltip == "VRAM 6.1 / 24.0 GiB · 2 running · 5 waiting (4 background)"


def test_restarts_and_problems_show_in_the_tooltip():
    assert view_of(None, restarts=2).tooltip == "vramgate: restarting · restarts 2"
    gave_up = view_of(None, supervisor_state="gave_up", supervisor_message="port 8450 in use")
    assert gave_up.tooltip == "vramgate: port 8450 in use"
    assert view_of(status(paused=True)).tooltip.endswith("· paused")


def test_equal_figures_give_equal_icon_views():
    assert view_of(STATUS).icon == view_of(copy.deepcopy(STATUS)).icon


def test_a_device_warning_leads_the_tooltip_and_stands_whole_in_the_menu():
    """An NVIDIA GPU with a CPU-only PyTorch: the person must see why the GPU sits idle."""
    warning = (
        "an NVIDIA GPU (NVIDIA GeForce RTX 4090) is present but this PyTorch is a CPU-only "
        "build, so vramgate serves on the CPU: install PyTorch's CUDA build and restart"
    )
    view = view_of(status(device__warnings=[warning]))
    assert view.tooltip.startswith("⚠ an NVIDIA GPU") and len(view.tooltip) <= 127
    assert f"⚠ {warning}" in view.lines
    assert "⚠" not in view_of(STATUS).tooltip  # no warning, no sign


def test_memory_given_back_to_other_programs_is_a_notice_once_and_a_menu_line():
    gave_back = {"bytes": int(3.1 * GiB), "models": ["chat", "embed"], "at": 1700000000.0}
    view = view_of(status(gave_back=gave_back))
    text = "vramgate gave 3.1 GiB back to other programs (unloaded chat, embed)"
    assert view.notice is not None and view.notice.text == text
    assert view.lines[-1] == text.removeprefix("vramgate ")
    assert view_of(status(gave_back=gave_back)).notice == view.notice  # the same: no new one
    later = view_of(status(gave_back={**gave_back, "at": 1700000060.0})).notice
    assert later != view.notice
    assert view_of(STATUS).notice is None


def gpu(index: int, used_gib: float, total_gib: float, name: str, waiting: int = 0) -> dict:
    return {
        "id": f"cuda:{index}",
        "name": name,
        "used_bytes": int(used_gib * GiB),
        "total_bytes": int(total_gib * GiB),
        "running": 1,
        "queue_depth": waiting,
    }


def test_two_gpus_the_gauge_shows_the_fullest_and_the_tooltip_each():
    gpus = [gpu(0, 6.0, 24.0, "RTX 4090"), gpu(1, 7.0, 8.0, "GTX 1080", waiting=5)]
    doc = status(devices=gpus, device__total_bytes=32 * GiB, device__used_bytes=13 * GiB)
    view = view_of(doc)
    # the sum would read 13/32 = 0.41; the 1080 is 7/8 full, which is what limits work there
    assert view.icon.vram_fraction == pytest.approx(7 / 8, abs=0.5 / 51)
    assert view.tooltip == "cuda:0 6.0/24.0 · cuda:1 7.0/8.0 GiB · 2 running · 5 waiting"
    assert "cuda:1 GTX 1080: 7.0 of 8.0 GiB · 1 running · 5 waiting" in view.lines
    assert len(view.tooltip) <= 127


def test_a_running_image_shows_its_step_in_the_tooltip_and_the_menu():
    paint = {
        "name": "paint",
        "state": "ready",
        "weights_bytes": 0,
        "running": [{"bucket": "px1024x1024xb4", "steps": [[12, 30]] * 3}],
    }
    view = view_of(status(models=[paint]))
    assert view.tooltip == "VRAM 6.1 / 24.0 GiB · 2 running · 5 waiting · image 12/30"
    assert "paint: image 12/30 (3 requests)" in view.lines
    second = {**paint, "name": "sketch", "running": [{"bucket": "b", "steps": [[0, 0]]}]}
    view = view_of(status(models=[paint, second]))
    assert view.tooltip.endswith("· image 12/30 +1") and "sketch: image" in view.lines
    assert not any("image" in line for line in view_of(STATUS).lines)  # none running


def test_the_gauge_fraction_has_the_icons_resolution():
    """A figure that moves by less than one pixel of the gauge gives an equal icon view
    (it was redrawn at each poll: used memory moves by a few KiB on a real GPU)."""
    from tray.icon import gauge_box
    from tray.view import GAUGE_STEPS

    _, top, _, bottom = gauge_box()
    assert bottom - top == GAUGE_STEPS
    used = int(6.1 * GiB)
    assert (
        view_of(status(device__used_bytes=used)).icon
        == view_of(status(device__used_bytes=used + 4096)).icon
    )
    one_pixel = 24 * GiB // GAUGE_STEPS
    assert (
        view_of(status(device__used_bytes=used)).icon
        != view_of(status(device__used_bytes=used + one_pixel)).icon
    )


def test_an_idle_models_keep_alive_end_is_a_clock_time_that_stays_put_across_polls():
    """/status counts `unloads_in_s` down at every poll; the view keeps one end (to the
    minute) while the polls agree within their jitter, and a model used again gets its
    new end."""
    import time

    def idle(left: float) -> dict:
        return status(models=[{"name": "m", "state": "ready", "weights_bytes": 0,
                               "unloads_in_s": left}])  # fmt: skip

    start = 1_700_000_000.0 + 59.9  # an end at a minute's edge: jitter would cross it
    first = view_of(idle(600.0), now=start)
    view = first
    for poll in range(1, 11):
        later = view_of(idle(600.0 - poll), now=start + poll + 0.003 * (-1) ** poll, previous=view)
        assert later == first
        view = first  # the monitor keeps the view it has while a new one equals it
    expected = time.strftime("%H:%M", time.localtime(start + 600.0))
    assert first.models[0].unloads_at == expected
    used_again = view_of(idle(600.0), now=start + 120, previous=first)
    assert used_again != first
    busy = view_of(status(models=[{"name": "m", "state": "ready", "weights_bytes": 0}]))
    assert busy.models[0].unloads_at is None


def test_a_loading_model_shows_how_far_its_load_has_come_in_the_tooltip():
    """From its /status row's `load` (app.core.lifecycle.load_watch.load_view): the
    fraction where known, else its seconds so far, else that it waits for memory."""
    measured = {"phase": "loading the weights", "fraction": 0.413, "elapsed_s": 2.5}
    timed = {"phase": "loading", "fraction": None, "elapsed_s": 3.2}
    waiting = {"phase": "waiting for memory", "fraction": None, "elapsed_s": None}
    rows = [
        {"name": "qwen3", "state": "loading", "weights_bytes": 0, "load": measured},
        {"name": "sd", "state": "loading", "weights_bytes": 0, "load": timed},
        {"name": "big", "state": "loading", "weights_bytes": 0, "load": waiting},
    ]
    tooltip = view_of(status(models=rows)).tooltip
    assert tooltip == "VRAM 6.1 / 24.0 GiB · 2 running · 5 waiting · loading qwen3 41% +2"
    assert view_of(status(models=rows[1:2])).tooltip.endswith(" · loading sd 3 s")
    assert view_of(status(models=rows[2:])).tooltip.endswith(" · big waiting for memory")
    assert "loading" not in view_of(STATUS).tooltip  # none loading
