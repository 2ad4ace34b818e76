"""Readiness: false until models are loaded and warm, false when the device is wedged,
false when a model cannot load; the handler's exceptions fail only their request."""

from __future__ import annotations

import asyncio
import time

import httpx

from app.config.settings import FaultInjection, ModelSpec, SimulatedBucket
from tests.support.live import wait_until

MiB = 2**20


def sim(run_ms: float, inject: FaultInjection | None = None, name: str = "sim") -> ModelSpec:
    return ModelSpec(
        name=name,
        kind="simulated",
        inject=inject or FaultInjection(),
        buckets=(SimulatedBucket(size=16, bytes=10 * MiB, run_ms=run_ms),),
    )


def test_simulated_wedged_device_turns_health_unready_then_recovers(server_factory):
    live = server_factory(
        device="simulated:1GiB",
        models=(sim(4000),),
        max_concurrent=1,
        health_interval=0.5,
        queue_timeout=1,
    )
    wait_until(lambda: live.service.scheduler.gate.running == 0, 30, "warm-up done")

    async def scenario() -> list[int]:
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            stuck = asyncio.create_task(
                client.post("/v1/embeddings", json={"model": "sim", "input": "x"})
            )
            # No job completes for longer than 3 probe intervals + the queue timeout.
            await asyncio.to_thread(
                wait_until,
                lambda: httpx.get(live.url + "/health").status_code == 503,
                10,
                "unhealthy while wedged",
            )
            wedged = httpx.get(live.url + "/health")
            done = await stuck
            return [wedged.status_code, done.status_code]

    assert asyncio.run(scenario()) == [503, 200]
    wait_until(lambda: httpx.get(live.url + "/health").status_code == 200, 15, "healthy again")


def test_model_that_fails_to_load_leaves_the_server_unready_but_others_serve(
    server_factory, tmp_path
):
    missing = tmp_path / "missing"
    broken = ModelSpec(name="broken", kind="embedding", path=missing, load="startup")
    live = server_factory(device="simulated:1GiB", models=(sim(1), broken), ready=False)
    wait_until(lambda: live.service.state.phase in ("ready", "degraded"), 60, "start-up done")
    assert httpx.get(live.url + "/health").status_code == 503
    states = {m["name"]: m for m in live.status()["models"]}
    assert states["broken"]["state"] == "failed" and "does not exist" in states["broken"]["error"]
    ok = httpx.post(live.url + "/v1/embeddings", json={"model": "sim", "input": "x"})
    assert ok.status_code == 200
    gone = httpx.post(live.url + "/v1/embeddings", json={"model": "broken", "input": "x"})
    assert gone.status_code == 404 and "failed to load" in gone.json()["error"]["message"]


def test_simulated_handler_exception_fails_only_its_request(server_factory):
    live = server_factory(
        device="simulated:1GiB", models=(sim(1, FaultInjection(error_on_calls=(2,))),)
    )
    with live.client() as client:
        failed = client.post("/v1/embeddings", json={"model": "sim", "input": "x"})
        ok = client.post("/v1/embeddings", json={"model": "sim", "input": "x"})
    assert failed.status_code == 500
    assert failed.json()["error"] == {
        "message": "the model failed on this request",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }
    assert ok.status_code == 200
    assert live.status()["pool"]["admitted_bytes"] == 0


def test_requests_before_the_model_is_ready_get_503_model_loading(server_factory):
    slow = ModelSpec(
        name="sim",
        kind="simulated",
        load_ms=3000,
        buckets=(SimulatedBucket(size=16, bytes=10 * MiB, run_ms=1),),
    )
    live = server_factory(device="simulated:1GiB", models=(slow,), ready=False)
    health = httpx.get(live.url + "/health")
    assert health.status_code == 503 and health.json()["state"] == "loading"
    response = httpx.post(live.url + "/v1/embeddings", json={"model": "sim", "input": "x"})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "model_loading"
    assert int(response.headers["Retry-After"]) >= 1
    wait_until(lambda: live.service.ready, 30, "ready")
    ok = httpx.post(live.url + "/v1/embeddings", json={"model": "sim", "input": "x"})
    assert ok.status_code == 200


def test_simulated_server_with_every_model_unloaded_stays_healthy(server_factory):
    live = server_factory(
        device="simulated:1GiB", models=(sim(1),), health_interval=0.5, queue_timeout=1
    )
    assert httpx.post(live.url + "/admin/models/sim/unload").json()["state"] == "unloaded"
    stale_after = 3 * 0.5 + 1  # what readiness allows without a completed job
    time.sleep(stale_after + 1.5)
    health = httpx.get(live.url + "/health")
    assert health.status_code == 200, health.json()
    assert live.status()["models"][0]["state"] == "unloaded"  # the probe did not reload it


def test_the_first_model_loads_at_start_and_the_others_on_their_first_request(server_factory):
    """The default load policy: the first model configured preloads; another is loaded
    by its first request (which waits for it) and the server is ready meanwhile."""
    other = ModelSpec(name="other", kind="simulated", load_ms=200)
    live = server_factory(device="simulated:1GiB", models=(sim(1), other))
    states = {m["name"]: m["state"] for m in live.status()["models"]}
    assert states == {"sim": "ready", "other": "unloaded"}
    assert httpx.get(live.url + "/health").status_code == 200
    answer = httpx.post(live.url + "/v1/embeddings", json={"model": "other", "input": "x"})
    assert answer.status_code == 200
    assert {m["name"]: m["state"] for m in live.status()["models"]}["other"] in ("warming", "ready")
