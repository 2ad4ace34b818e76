"""Several models on one simulated GPU (the simulated device and model, as config
choices): models load on demand, the least recently used idle ones make room, and idle
ones give memory back when another program takes it (a test control of the simulated
device, as a real program's allocation does). Over real HTTP."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.config.settings import ModelSpec, SimulatedBucket
from tests.support.live import wait_until

MiB, GiB = 2**20, 2**30
RESERVE = 768 * MiB


def model(name: str, *, run_ms: float = 10, load: str = "demand") -> ModelSpec:
    return ModelSpec(
        name=name,
        kind="simulated",
        weights=int(1.5 * GiB),
        load_ms=20,
        load=load,  # type: ignore[arg-type]
        buckets=(SimulatedBucket(size=16, bytes=50 * MiB, run_ms=run_ms),),
    )


def evictions(live, reason: str) -> float:
    text = httpx.get(live.url + "/metrics", timeout=30).text
    return sum(  # on every device
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vramgate_evictions_total" and sample.labels["reason"] == reason
    )


def states(live) -> dict[str, str]:
    return {m["name"]: m["state"] for m in live.status()["models"]}


def embed(live, name: str) -> httpx.Response:
    return httpx.post(live.url + "/v1/embeddings", json={"model": name, "input": "w"}, timeout=60)


def test_simulated_three_models_of_1_5_gib_take_turns_on_4_gib_under_a_flood(server_factory):
    """300 requests over three 1.5 GiB models from 16 clients on a 4 GiB device less a
    768 MiB reserve: two fit at a time, with a few jobs beside them (a gate that ignored
    the reserve would run eight); every request is answered 200, nothing runs out of
    memory, nothing of ours enters the reserve."""
    live = server_factory(
        device="simulated:4GiB",
        reserve=RESERVE,
        models=(model("a", load="startup"), model("b"), model("c")),
        headroom=256 * MiB,
    )
    device = live.service.device
    rng = random.Random(7)
    picks = [rng.choice("abc") for _ in range(300)]

    async def flood() -> list[int]:
        queue: asyncio.Queue[str] = asyncio.Queue()
        for name in picks:
            queue.put_nowait(name)
        codes: list[int] = []
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(base_url=live.url, timeout=120, limits=limits) as client:

            async def one_client() -> None:
                while not queue.empty():
                    body = {"model": queue.get_nowait(), "input": "w w w"}
                    codes.append((await client.post("/v1/embeddings", json=body)).status_code)

            await asyncio.gather(*(one_client() for _ in range(16)))
        return codes

    started = time.perf_counter()
    codes = asyncio.run(flood())
    took = time.perf_counter() - started
    lru = evictions(live, "lru")
    print(f"\n300 requests over 3 models in {took:.1f}s; {lru:.0f} evictions (lru)")
    assert device.oom_count == 0
    assert device.high_water <= 4 * GiB - RESERVE, device.high_water / MiB
    assert codes == [200] * 300
    assert lru >= 1
    assert "failed" not in states(live).values()


def test_simulated_the_least_recently_used_idle_model_makes_room(server_factory):
    live = server_factory(
        device="simulated:4GiB",
        models=(model("a", load="startup"), model("b"), model("c")),
        headroom=256 * MiB,
    )
    assert embed(live, "b").status_code == 200  # loads b beside a
    assert embed(live, "a").status_code == 200  # a is now the most recently used
    assert states(live) == {"a": "ready", "b": "ready", "c": "unloaded"}
    loading = embed(live, "c")  # needs one of them gone: b, used longer ago
    assert loading.status_code == 200
    assert float(loading.headers["X-Vramgate-Queue-Ms"]) >= 20  # its wait for the load
    assert float(embed(live, "c").headers["X-Vramgate-Queue-Ms"]) < 20
    wait_until(lambda: states(live)["c"] == "ready", 10, "c ready")
    assert states(live) == {"a": "ready", "b": "unloaded", "c": "ready"}
    assert evictions(live, "lru") == 1


def test_simulated_a_game_starts_idle_models_give_memory_back_and_reload_after(server_factory):
    """A 4 GiB device serving a (busy) and b (idle). Another program takes 1.2 GiB: b is
    unloaded within 2 s, a's running request completes, the pool is back above the
    headroom; when the program quits, b's next request loads it again."""
    live = server_factory(
        device="simulated:4GiB",
        models=(model("a", run_ms=1500, load="startup"), model("b")),
        headroom=512 * MiB,
    )
    device = live.service.device
    assert embed(live, "b").status_code == 200
    assert states(live) == {"a": "ready", "b": "ready"}

    async def scenario() -> tuple[int, float]:
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            body = {"model": "a", "input": "w"}
            running = asyncio.create_task(client.post("/v1/embeddings", json=body))
            await asyncio.to_thread(
                wait_until, lambda: live.service.scheduler.gate.running == 1, 10, "a runs"
            )
            cut = time.perf_counter()
            device.set_external(int(1.2 * GiB))  # the game starts
            await asyncio.to_thread(
                wait_until, lambda: states(live)["b"] == "unloaded", 2, "b given back"
            )
            gave_back_s = time.perf_counter() - cut
            assert not running.done(), "a's request still runs while b goes"
            return (await running).status_code, gave_back_s

    code, gave_back_s = asyncio.run(scenario())
    status = live.status()
    print(f"\nb unloaded {gave_back_s * 1000:.0f} ms after the cut")
    assert code == 200
    assert status["pool"]["pool_bytes"] >= 512 * MiB
    assert status["gave_back"]["bytes"] == int(1.5 * GiB)
    assert status["gave_back"]["models"] == ["b"]
    assert evictions(live, "pressure") == 1
    assert states(live)["a"] == "ready"

    device.set_external(0)  # the game quits
    again = time.perf_counter()
    assert embed(live, "b").status_code == 200
    print(f"b's next request, with its reload: {(time.perf_counter() - again) * 1000:.0f} ms")
    assert states(live)["b"] in ("warming", "ready")
    assert device.oom_count == 0


def test_simulated_a_model_that_leaves_less_than_the_headroom_is_not_given_back_at_once(
    server_factory,
):
    """A big model on a small GPU leaves jobs less than `headroom` by itself: that is no
    other program's doing, and unloading it at every idle moment would reload it for
    every request. Only memory taken after it loaded is given back."""
    big = ModelSpec(
        name="big",
        kind="simulated",
        weights=int(3.6 * GiB),
        load="startup",
        buckets=(SimulatedBucket(size=16, bytes=50 * MiB, run_ms=5),),
    )
    live = server_factory(device="simulated:4GiB", models=(big,), headroom=512 * MiB)
    assert embed(live, "big").status_code == 200
    time.sleep(0.5)  # ten housekeeping rounds
    assert states(live) == {"big": "ready"} and evictions(live, "pressure") == 0
    live.service.device.set_external(300 * MiB)  # now another program takes some
    wait_until(lambda: states(live)["big"] == "unloaded", 2, "given back")
    assert evictions(live, "pressure") == 1
    live.service.device.set_external(0)  # it quits: the next request loads the model
    assert embed(live, "big").status_code == 200
    time.sleep(0.5)
    assert states(live) == {"big": "ready"} and evictions(live, "pressure") == 1
