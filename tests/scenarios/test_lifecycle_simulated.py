"""Loads go through the gate, unloads end what still runs properly: a simulated 1 GiB
device whose simulated models really hold their weights while loaded."""

from __future__ import annotations

import json
import threading
import time

import httpx

from app.config.settings import ModelSpec, SimulatedBucket
from tests.support.live import Live, wait_until

MiB = 2**20
RESERVE = 200 * MiB  # left to other programs
# "a" generates for 40 steps × 25 ms holding 700 MiB; "b" has 600 MiB of weights
A = ModelSpec(
    name="a",
    kind="simulated",
    weights=100 * MiB,
    buckets=(SimulatedBucket(size=64, bytes=700 * MiB, run_ms=25, warm=False),),
)
B = ModelSpec(name="b", kind="simulated", weights=600 * MiB, buckets=A.buckets)


def stream_lines(url: str, model: str, out: list[str], ended: list[float]) -> None:
    body = {"model": model, "prompt": "one two", "max_tokens": 40, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        out.extend(line for line in r.iter_lines() if line)
    ended.append(time.monotonic())


def start_stream(url: str, model: str, status) -> tuple[threading.Thread, list[str], list[float]]:
    """A stream of `model` in a thread, returned once the server runs it."""
    lines: list[str] = []
    ended: list[float] = []
    stream = threading.Thread(target=stream_lines, args=(url, model, lines, ended))
    stream.start()
    while status()["queue"]["running"] == 0:
        time.sleep(0.01)
    return stream, lines, ended


def test_simulated_a_load_waits_for_room_for_its_weights(server_factory):
    # with a reserve: a's weights and stream (800 MiB) fit below it, b's 600 MiB never do
    live = server_factory(device="simulated:1GiB", reserve=RESERVE, models=(A, B), max_concurrent=4)
    device = live.service.device
    with live.client() as client:
        assert client.post("/admin/models/b/unload").json()["state"] == "unloaded"
        # two runs alone teach a's price (700 MiB both times: no spread to allow for), so
        # its stream shares the device
        short = {"model": "a", "prompt": "one", "max_tokens": 2}
        for _ in range(2):
            assert client.post("/v1/completions", json=short).status_code == 200
        stream, lines, ended = start_stream(live.url, "a", live.status)
        assert not any(p.exclusive for p in live.service.scheduler.gate.permits)
        # 1 GiB − reserve − a's 100 MiB of weights − its stream's 700 MiB: no room for 600
        loaded = client.post("/admin/models/b/load").json()
        stream.join()
    # The simulated device really holds b's weights: a load that had not waited for the
    # stream to end would have run out of memory and left b "failed".
    assert device.oom_count == 0
    assert device.high_water <= 1024 * MiB - RESERVE, device.high_water / MiB
    assert loaded["state"] == "ready", loaded
    assert ended
    assert lines[-1] == "data: [DONE]" and "error" not in lines[-2]


def test_simulated_unload_ends_a_running_stream_with_an_error_event_not_a_500(server_factory):
    live = server_factory(device="simulated:1GiB", models=(A,), max_concurrent=4)
    stream, lines, _ = start_stream(live.url, "a", live.status)
    with live.client() as client:
        unloaded = client.post("/admin/models/a/unload", params={"wait_s": 0.1}).json()
    stream.join()
    assert unloaded["state"] == "unloaded" and unloaded["freed_bytes"] >= 100 * MiB
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2][len("data: ") :])["error"]
    assert error["code"] == "model_loading" and "unloaded" in error["message"]
    assert live.service.device.allocated() == 0  # weights and stream both gone
    status = live.status()
    assert status["queue"]["running"] == 0 and status["pool"]["admitted_bytes"] == 0


def test_simulated_a_request_sent_during_an_unload_waits_for_the_reload(server_factory):
    live = server_factory(device="simulated:1GiB", models=(A,), max_concurrent=4)
    stream, _, ended = start_stream(live.url, "a", live.status)
    answers: list[httpx.Response] = []

    def unload() -> None:
        httpx.post(live.url + "/admin/models/a/unload", timeout=60)  # waits for the stream

    unloading = threading.Thread(target=unload)
    unloading.start()
    while live.status()["models"][0]["state"] != "unloading":
        time.sleep(0.01)
    body = {"model": "a", "input": "one two"}
    answers.append(httpx.post(live.url + "/v1/embeddings", json=body, timeout=60))
    answered_at = time.monotonic()
    unloading.join()
    stream.join()
    assert answers[0].status_code == 200, answers[0].text
    assert answered_at > ended[0]  # after the stream, the unload and the load again
    assert live.status()["models"][0]["state"] == "ready"


def test_simulated_a_fault_while_starting_the_models_is_logged_and_the_server_degraded(
    server_factory, monkeypatch, caplog
):
    """A fault of ours while the models start (a preprocess that raised TypeError once
    left a server 'warming' forever, saying nothing): it is logged with its traceback,
    the phase is degraded, and the server still answers."""
    from app.core.lifecycle.loads import ModelLoads

    async def broken(self) -> None:
        raise TypeError("object of type 'ImagePrompt' has no len()")

    monkeypatch.setattr(ModelLoads, "start", broken)
    live = server_factory(device="simulated:1GiB", ready=False, health_interval=3600)
    wait_until(lambda: live.status()["state"] == "degraded", 10, "degraded")
    assert any("starting the models failed" in r.message for r in caplog.records)
    assert any(r.exc_info and r.exc_info[0] is TypeError for r in caplog.records)
    assert live.client().get("/status").status_code == 200


def test_simulated_an_unload_during_the_warm_up_leaves_the_model_unloaded_not_failed(
    server_factory, caplog
):
    """A model unloaded while its warm-up runs (a person's Unload in the tray, moments
    after its load): its warm-up ends by the unload, which is no failure; the model is
    unloaded, serves again on its next request, and no error is logged."""
    slow_warm = ModelSpec(
        name="w",
        kind="simulated",
        weights=100 * MiB,
        load="demand",
        buckets=(  # warmed one after the other: the unload comes during the first
            SimulatedBucket(size=64, bytes=100 * MiB, run_ms=3000),
            SimulatedBucket(size=128, bytes=100 * MiB, run_ms=10),
        ),
    )
    live = server_factory(device="simulated:1GiB", models=(slow_warm,))
    row = lambda: live.status()["models"][0]  # noqa: E731
    with live.client() as client:
        loading = threading.Thread(target=client.post, args=("/admin/models/w/load",))
        loading.start()
        wait_until(lambda: row()["state"] == "warming", 30, "w warming up")
        assert client.post("/admin/models/w/unload", timeout=60).json()["state"] == "unloaded"
        loading.join(60)
        wait_until(lambda: row()["state"] != "warming", 30, "the warm-up ended")
        assert row()["state"] == "unloaded" and not row().get("error"), row()
        assert not [r for r in caplog.records if "warm-up failed" in r.getMessage()]
        # the positive control: its next request loads it and is served
        body = {"model": "w", "prompt": "one", "max_tokens": 1}
        assert client.post("/v1/completions", json=body, timeout=60).status_code == 200
        assert row()["state"] in ("warming", "ready")


def test_simulated_a_load_that_finds_no_room_in_time_is_a_503_and_is_tried_again(server_factory):
    """Another program holds the memory a model's load needs for longer than the queue
    waits: the request that asked gets a 503 with Retry-After (no room now, as any
    overload), the model stays unloaded, not failed, and once the memory is back its next
    request loads it and is served."""
    runs = (SimulatedBucket(size=64, bytes=100 * MiB, run_ms=25, warm=False),)
    big = ModelSpec(name="big", kind="simulated", weights=600 * MiB, load="demand", buckets=runs)
    live = server_factory(device="simulated:1GiB", models=(big,), queue_timeout=1.0)
    device = live.service.device
    body = {"model": "big", "prompt": "one", "max_tokens": 1}
    with live.client() as client:
        device.set_external(700 * MiB)  # a game: 600 MiB of weights do not fit beside it
        wait_until(lambda: live.status()["device"]["used_by_others_bytes"] > 0, 10, "seen")
        refused = client.post("/v1/completions", json=body, timeout=60)
        assert refused.status_code == 503 and "Retry-After" in refused.headers, refused.text
        row = live.status()["models"][0]  # unloaded, or its next try waiting for room
        assert row["state"] in ("unloaded", "loading"), row
        device.set_external(0)  # the game ends
        wait_until(lambda: live.status()["device"]["used_by_others_bytes"] == 0, 10, "seen")
        served = client.post("/v1/completions", json=body, timeout=60)
        assert served.status_code == 200, served.text


def asked_while_loading(
    live: Live, client: httpx.Client, body: dict, others_take: int
) -> httpx.Response | None:
    """`body` asked of a model that loads on demand (`big`, 600 MiB of weights loaded in
    two halves), and another program taking `others_take` bytes once the first half is
    on the device; the answer (None if none came within a minute)."""
    device = live.service.device
    answers: list[httpx.Response] = []
    asking = threading.Thread(
        target=lambda: answers.append(client.post("/v1/completions", json=body, timeout=60)),
        daemon=True,
    )
    asking.start()
    wait_until(lambda: device.allocated() > 0, 30, "its first half on the device")
    device.set_external(others_take)
    asking.join(60)
    return answers[0] if answers else None


def big_loading_in_halves(bucket_bytes: int, warm: bool) -> ModelSpec:
    runs = (SimulatedBucket(size=64, bytes=bucket_bytes, run_ms=25, warm=warm),)
    return ModelSpec(
        name="big", kind="simulated", weights=600 * MiB, load="demand", load_ms=1500, buckets=runs
    )


def test_simulated_a_load_cut_short_by_out_of_memory_is_a_503_frees_its_part_and_is_tried_again(
    server_factory,
):
    """Another program takes memory while a model loads: half its weights are on the
    device, the rest finds no room and the device runs out of memory. The request that
    asked gets a 503 with Retry-After, the half already moved is given back, the model is
    unloaded (not failed: nothing is wrong with it) saying why, and once the memory is
    back its next request loads it and is served (the refusal's own request tried it
    again: that try waits in the queue for the room, holding nothing)."""
    big = big_loading_in_halves(100 * MiB, warm=False)
    live = server_factory(device="simulated:1GiB", models=(big,), queue_timeout=30.0)
    device = live.service.device
    body = {"model": "big", "prompt": "one", "max_tokens": 1}
    with live.client() as client:
        # a game starts: 300 + 300 + 700 MiB > 1 GiB
        refused = asked_while_loading(live, client, body, 700 * MiB)
        assert refused is not None
        assert refused.status_code == 503 and "Retry-After" in refused.headers, refused.text
        assert refused.json()["error"]["code"] == "model_loading", refused.text
        assert "its last load ran out of memory" in refused.json()["error"]["message"]
        row = live.status()["models"][0]  # unloaded, or its next try waiting for room
        assert row["state"] in ("unloaded", "loading"), row
        assert device.allocated() == 0  # the half it had moved is given back
        assert device.describe()["ooms"] == 1  # the device's own out-of-memory, once
        device.set_external(0)  # the game ends
        wait_until(lambda: live.status()["device"]["used_by_others_bytes"] == 0, 10, "seen")
        served = client.post("/v1/completions", json=body, timeout=60)
        assert served.status_code == 200, served.text
        assert live.status()["models"][0]["state"] in ("warming", "ready")


def test_simulated_a_warm_up_that_finds_no_room_gives_the_weights_back_and_is_tried_again(
    server_factory, caplog
):
    """Another program takes memory while a model loads, leaving room for its weights but
    not for its warm-up's run: the warm-up waits its queue_timeout and finds none. The
    model is not failed (it loaded; nothing is wrong with it): its weights go back, it is
    unloaded saying why, and once the memory is back its next request loads, warms and
    is served. Before, it stayed failed (404) with its weights held."""
    big = big_loading_in_halves(1024 * MiB, warm=True)
    live = server_factory(device="simulated:4GiB", models=(big,), queue_timeout=2.0)
    device = live.service.device
    body = {"model": "big", "prompt": "one", "max_tokens": 1}

    def row() -> dict:
        return live.status()["models"][0]

    with live.client() as client:
        # room for its second half, not for its warm-up
        asked_while_loading(live, client, body, 3296 * MiB)
        wait_until(lambda: row()["state"] in ("unloaded", "failed"), 30, "its warm-up's end")
        assert row()["state"] == "unloaded" and "warm-up found no room" in row()["error"], row()
        assert device.allocated() == 0  # its weights went back
        assert not [r for r in caplog.records if "warm-up failed" in r.getMessage()]
        device.set_external(0)  # the game ends
        wait_until(lambda: live.status()["device"]["used_by_others_bytes"] == 0, 10, "seen")
        served = client.post("/v1/completions", json=body, timeout=60)
        assert served.status_code == 200, served.text
        wait_until(lambda: row()["state"] == "ready", 30, "warmed up")
