"""Admin routes the tray uses: pause/resume and unload/load, loopback only."""

from __future__ import annotations

import asyncio

import httpx

from app.settings import ModelSpec, SimulatedBucket
from tests.live import wait_until

MiB = 2**20
SIM = ModelSpec(
    name="sim", kind="simulated", buckets=(SimulatedBucket(size=16, bytes=10 * MiB, run_ms=1),)
)


def test_simulated_pause_refuses_new_work_with_503_and_resume_undoes_it(server_factory):
    live = server_factory(device="simulated:1GiB", models=(SIM,))
    with live.client() as client:
        assert client.post("/admin/pause").json() == {"paused": True}
        refused = client.post("/v1/embeddings", json={"model": "sim", "input": "x"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "paused"
        assert int(refused.headers["Retry-After"]) >= 1
        assert client.get("/status").json()["paused"] is True
        assert client.get("/health").status_code == 200  # paused is not unhealthy
        assert client.post("/admin/resume").json() == {"paused": False}
        assert client.post("/v1/embeddings", json={"model": "sim", "input": "x"}).status_code == 200


def test_unload_frees_the_real_models_memory_and_a_request_loads_it_again(server_factory):
    live = server_factory(device="cpu")
    name = "all-MiniLM-L6-v2"
    before = live.status()
    weights = before["models"][0]["weights_bytes"]
    with live.client() as client:
        answer = client.post(f"/admin/models/{name}/unload").json()
        after = client.get("/status").json()
        assert answer["state"] == "unloaded" and after["models"][0]["weights_bytes"] == 0
        # On the CPU part of the weights is a mapping of the safetensors file and the
        # rest of what loading grew by is one-time imports, so RSS gives back part of it;
        # on CUDA the allocator's figures drop by the weights exactly.
        freed = before["device"]["used_by_us_bytes"] - after["device"]["used_by_us_bytes"]
        assert freed > 0.25 * weights, (freed, weights)
        assert answer["freed_bytes"] > 0
        assert after["device"]["weights_bytes"] < before["device"]["weights_bytes"]
        # a request for the unloaded model loads it and waits for it, like any wait
        again = client.post("/v1/embeddings", json={"model": name, "input": "x"})
        assert again.status_code == 200 and len(again.json()["data"][0]["embedding"]) == 384
        wait_until(
            lambda: client.get("/status").json()["models"][0]["state"] == "ready",
            60,
            "warmed up again",
        )


def test_admin_routes_refuse_callers_that_are_not_on_loopback(server_factory):
    live = server_factory(device="simulated:1GiB", models=(SIM,))
    transport = httpx.ASGITransport(app=live.app, client=("192.168.1.20", 50000))

    async def call() -> httpx.Response:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.post("/admin/pause")

    response = asyncio.run(call())
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    assert live.status()["paused"] is False


def test_history_keeps_samples_and_rejections(server_factory):
    live = server_factory(device="simulated:1GiB", models=(SIM,))
    with live.client() as client:
        client.post("/admin/pause")
        client.post("/v1/embeddings", json={"model": "sim", "input": "x"})
        wait_until(lambda: len(client.get("/history").json()["samples"]) >= 2, 10, "samples")
        history = client.get("/history").json()
    assert history["rejections"][0]["code"] == "paused"
    sample = history["samples"][-1]
    assert sample["total"] == 1024 * MiB and {"admitted", "depth", "running"} <= set(sample)


def test_shutdown_route_drains_and_stops_the_server(server_factory):
    live = server_factory(device="simulated:1GiB", models=(SIM,))
    assert httpx.post(live.url + "/admin/shutdown").json() == {"stopping": True}

    def refused() -> bool:
        try:
            httpx.get(live.url + "/health", timeout=1)
        except httpx.TransportError:
            return True
        return False

    wait_until(refused, 30, "no longer accepting")
    wait_until(lambda: live.service.state.phase == "stopping", 30, "drained and stopped")
