"""A load you can watch (app.core.lifecycle.load_watch): a loading model's /status row
says its phase and how far it has come, and its log says each phase and reminds on a long
one; over HTTP with a simulated model whose load takes seconds, its second load measured
against the first."""

from __future__ import annotations

import logging
import threading
from typing import Any

import httpx

from app.config.settings import ModelSpec
from app.core.lifecycle.load_watch import WAITING, LoadWatch, load_view, said
from app.models.base import LoadProgress
from tests.support.live import Live, live_server, make_settings, wait_until

MiB = 2**20


def test_the_view_takes_the_engines_bytes_else_the_last_loads_time():
    measured = LoadProgress("loading the weights", 3, 7, 300 * MiB, 1000 * MiB)
    view = load_view(measured, 2.0, 8.0)
    assert (view["phase"], view["step"], view["steps"]) == ("loading the weights", 3, 7)
    assert (view["fraction"], view["fraction_from"]) == (0.3, "bytes held of planned")
    assert said(view) == "loading the weights (3 of 7), 30%, 2.0 s"
    timed = load_view(None, 2.0, 8.0)
    assert (timed["phase"], timed["fraction"]) == ("loading", 0.25)
    assert timed["fraction_from"] == "time of its last load"
    assert load_view(None, 9.0, 8.0)["fraction"] == 0.99  # longer than last time: not done
    first = load_view(None, 2.0, None)
    assert first["fraction"] is None and said(first) == "loading, 2.0 s"
    assert load_view(None, None, 8.0)["phase"] == WAITING
    over = LoadProgress("warming up", 6, 7, 1200 * MiB, 1000 * MiB)
    assert over.fraction == 0.99 and LoadProgress("x").fraction is None


def test_the_watch_logs_each_phase_once_and_reminds_on_a_long_one(caplog):
    phases = iter(["a", "a", "b", "b", "b", "b", "c"])
    seen = threading.Event()
    clock = iter(range(0, 1000, 4))  # each look 4 s after the last (a fake clock)

    def progress() -> LoadProgress:
        phase = next(phases, "c")
        if phase == "c":
            seen.set()
        return LoadProgress(phase)

    caplog.set_level(logging.INFO, "vramgate.registry")
    with LoadWatch("m", progress, None, clock=lambda: next(clock), every_s=0.001, remind_s=10):
        assert seen.wait(10)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model m")]
    phases_said = [line.split(": ")[1].split(",")[0] for line in lines]
    # a at 4 s; b at 12 s, again at 24 s (10 s later, still b); c at 28 s
    assert phases_said[:4] == ["a", "b", "b", "c"], lines


def test_an_engine_done_with_its_part_keeps_its_last_phase_in_the_log(caplog):
    """A llama.cpp runner's progress ends when it serves, before the load is done (its
    measures after): the log goes on saying its last phase, never a bare `loading`."""
    looks = iter([LoadProgress("a", 1, 2), LoadProgress("b", 2, 2), None, None, None])
    seen = threading.Event()
    clock = iter(range(0, 1000, 4))

    def progress() -> LoadProgress | None:
        look = next(looks, "end")
        if look == "end":
            seen.set()
            return None
        return look

    caplog.set_level(logging.INFO, "vramgate.registry")
    with LoadWatch("m", progress, None, clock=lambda: next(clock), every_s=0.001, remind_s=10):
        assert seen.wait(10)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model m")]
    assert lines and all(" (" in line for line in lines), lines
    assert [line.split(": ")[1].split(" (")[0] for line in lines][:3] == ["a", "b", "b"], lines


def a_load_seen_in_status(live: Live) -> dict[str, Any]:
    """Load `slow` and look at /status while it loads: its row's `load` once it has
    begun (the load waited for)."""
    started = threading.Thread(
        target=httpx.post, args=(live.url + "/admin/models/slow/load",), kwargs={"timeout": 60}
    )
    started.start()
    seen: list[dict[str, Any]] = []

    def loading() -> bool:
        row = next(m for m in live.status()["models"] if m["name"] == "slow")
        if row["state"] == "loading" and row["load"]["elapsed_s"]:
            seen.append(row["load"])
        return bool(seen)

    wait_until(loading, 30, "a loading row with its seconds")
    started.join(60)
    row = live.status()["models"][0]
    assert row["state"] == "ready" and "load" not in row
    return seen[0]


def test_a_long_load_shows_its_progress_in_status_and_the_log(tmp_path, caplog):
    """A simulated model whose load takes 1.5 s: while it loads, /status says `loading`
    with its seconds so far; its second load, how far by the first one's time."""
    caplog.set_level(logging.INFO, "vramgate.registry")
    slow = ModelSpec(name="slow", kind="simulated", load_ms=1500, load="demand")
    settings = make_settings(tmp_path, device="simulated:1GiB", models=(slow,))
    with live_server(settings) as live:
        first = a_load_seen_in_status(live)
        httpx.post(live.url + "/admin/models/slow/unload", timeout=60)
        second = a_load_seen_in_status(live)
    assert first["phase"] == "loading" and first["elapsed_s"] > 0 and first["fraction"] is None
    assert second["expected_s"] >= 1.5 and 0 < second["fraction"] <= 0.99
    assert second["fraction_from"] == "time of its last load"
    lines = [r.getMessage() for r in caplog.records]
    assert "model slow loading on simulated:0" in lines
    assert any(
        m.startswith("model slow loading on simulated:0 (its last load took 1.") for m in lines
    )
    assert any(m.startswith("model slow loading: loading, ") for m in lines)
