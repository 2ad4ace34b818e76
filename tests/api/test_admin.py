"""Admin routes the tray and the dashboard use: pause/resume, unload/load and pull,
loopback only."""

from __future__ import annotations

import asyncio
import json

import httpx

from app.config.settings import ConfigSource, ModelSpec, SimulatedBucket
from app.store.manage import folder_bytes
from tests.support.live import live_server, make_settings, wait_until
from tests.support.random_models import save_model_wheel, save_random_bert

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


def test_a_pull_through_the_server_streams_its_progress_and_serves_the_model(tmp_path):
    """POST /admin/models/pull: NDJSON progress in Ollama's pull shape (steps, then bytes
    with total and completed), then success; the model is listed and answers."""
    model = save_random_bert(tmp_path / "src/tiny-embed", hidden=32, layers=1, heads=2, max_seq=64)
    wheel = save_model_wheel(model, tmp_path / "tiny_embed-1.0-py3-none-any.whl")
    config = tmp_path / "config.toml"
    config.write_text('[[models]]\nname = "sim"\nkind = "simulated"\n')
    source = ConfigSource(config, {"device": "cpu", "models_dir": tmp_path / "models"})
    settings = make_settings(tmp_path, device="cpu", models=source.settings().models)
    with live_server(settings, models_source=source) as live:
        bad = httpx.post(live.url + "/admin/models/pull", json={"source": "not a thing"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "source"
        with httpx.stream(
            "POST", live.url + "/admin/models/pull", json={"source": str(wheel)}, timeout=120
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "application/x-ndjson"
            events = [json.loads(line) for line in response.iter_lines() if line]
        counts = [e for e in events if "total" in e]
        assert counts[0]["status"].startswith("unpacking") and counts[0]["completed"] == 0
        copied = [e for e in counts if e["status"].startswith("copying")]
        assert copied[-1]["completed"] == copied[-1]["total"] == folder_bytes(model)
        assert events[-1] == {"status": "success", "model": "tiny-embed", "kind": "embedding"}
        listed = httpx.get(live.url + "/v1/models").json()["data"]
        assert [m["id"] for m in listed] == ["sim", "tiny-embed"]
        body = {"model": "tiny-embed", "input": "a cat"}
        assert httpx.post(live.url + "/v1/embeddings", json=body, timeout=120).status_code == 200
        again = httpx.post(live.url + "/admin/models/pull", json={"source": str(wheel)})
        assert again.status_code == 200
        assert "exists" in again.text.splitlines()[-1]  # {"error": "... exists; pass --force"}
