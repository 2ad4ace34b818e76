"""Several GPUs in one server, on simulated devices (`simulated:4GiB,8GiB`, a config
choice): each device has its own pool and gate, models are placed where they fit, a
replicated model's requests are spread over its copies, and a flood never runs a device
out of memory. The simulated model's declared costs are a third of what it really
allocates: the server must measure them, on each device. Over real HTTP."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.config.settings import ConfigSource, ModelSpec, SimulatedBucket
from app.errors import DeviceUnavailable
from app.store.manage import format_status
from tests.support.live import live_server, make_settings

MiB, GiB = 2**20, 2**30
RESERVE = 512 * MiB


def model(name: str, weights: int, replicas: int = 1, **more) -> ModelSpec:
    bucket = SimulatedBucket(size=16, bytes=200 * MiB, true_bytes=600 * MiB, run_ms=20)
    return ModelSpec(
        name=name,
        kind="simulated",
        weights=weights,
        replicas=replicas,
        load="startup",
        buckets=(bucket,),
        **more,
    )


def served_by_device(metrics: str, model: str) -> dict[str, float]:
    return {
        sample.labels["device"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "vramgate_requests_total"
        and sample.labels["model"] == model
        and sample.labels["outcome"] == "ok"
    }


async def flood(url: str, picks: list[str], clients: int) -> list[tuple[str, int, str]]:
    """Each request's model, status and the device its answer names."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for name in picks:
        queue.put_nowait(name)
    answers: list[tuple[str, int, str]] = []
    # idle connections expire here before the server's keep-alive (5 s) closes them, so
    # no request goes out on a connection the server is closing
    limits = httpx.Limits(max_connections=clients, keepalive_expiry=2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def one_client() -> None:
            while not queue.empty():
                name = queue.get_nowait()
                reply = await client.post("/v1/embeddings", json={"model": name, "input": "w w"})
                answers.append((name, reply.status_code, reply.headers["X-Vramgate-Device"]))

        await asyncio.gather(*(one_client() for _ in range(clients)))
    return answers


def test_simulated_4_and_8_gib_place_a_5_gib_model_on_the_larger_and_spread_a_replicated_one(
    tmp_path,
):
    settings = make_settings(
        tmp_path,
        device="simulated:4GiB,8GiB",
        reserve=RESERVE,
        headroom=256 * MiB,
        models=(model("small", 256 * MiB, replicas=2), model("big", 5 * GiB)),
    )
    with live_server(settings) as live:
        status = live.status()
        rows = {row["name"]: row for row in status["models"]}
        assert rows["big"]["devices"] == ["simulated:1"]  # the 8 GiB one, listed second
        assert sorted(rows["small"]["devices"]) == ["simulated:0", "simulated:1"]
        assert [d["id"] for d in status["devices"]] == ["simulated:0", "simulated:1"]
        assert status["device"]["total_bytes"] == 12 * GiB  # the sum on top
        assert all(row["state"] == "ready" for row in rows.values())
        printed = format_status(status).splitlines()  # `vramgate status`
        assert any(line.split()[:3] == ["simulated:1", "Simulated", "8.0"] for line in printed)
        assert any(line.strip().startswith("simulated:0") and "small" in line for line in printed)

        rng = random.Random(3)
        picks = [rng.choice(["small"] * 15 + ["big"]) for _ in range(640)]
        answers = asyncio.run(flood(live.url, picks, clients=64))
        assert [code for _, code, _ in answers] == [200] * len(picks)
        assert {device for name, _, device in answers if name == "big"} == {"simulated:1"}
        assert {device for name, _, device in answers if name == "small"} == {
            "simulated:0",
            "simulated:1",
        }

        metrics = httpx.get(live.url + "/metrics", timeout=30).text
        small = served_by_device(metrics, "small")
        big = served_by_device(metrics, "big")
        print(f"\nsmall served by device: {small}; big: {big}")
        assert small.get("simulated:0", 0) > 50 and small.get("simulated:1", 0) > 50
        assert set(big) == {"simulated:1"}  # never on the device that lacks it
        warm = sum(small.values()) + sum(big.values()) - len(picks)  # warm-up requests
        assert 0 <= warm < 20
        for lane in live.fleet.lanes:
            device = lane.device
            pool = device.capacity - RESERVE  # models and jobs may never hold more
            print(f"{device.id}: high water {device.high_water / MiB:.0f} MiB of {pool / MiB:.0f}")
            assert device.oom_count == 0
            assert device.high_water <= pool
        status = live.status()
        assert sum(status["counters"]["served_by_device"].values()) == sum(small.values()) + sum(
            big.values()
        )
        pools = [
            sample.labels["device"]
            for family in text_string_to_metric_families(metrics)
            for sample in family.samples
            if sample.name == "vramgate_pool_bytes"
        ]
        assert pools == ["simulated:0", "simulated:1"]


def test_a_model_pinned_to_a_device_the_server_lacks_is_a_settings_error(tmp_path):
    settings = make_settings(
        tmp_path, device="simulated:4GiB", models=(model("m", 0, device="simulated:1"),)
    )
    with pytest.raises(DeviceUnavailable, match="simulated:1"), live_server(settings):
        pass


TOML_MODEL = """
[[models]]
name = "{name}"
kind = "simulated"
weights = "{weights}"
replicas = {replicas}
buckets = [{{size = 16, bytes = "10MiB", run_ms = 1}}]
"""


def test_simulated_a_reread_config_places_new_models_by_room_and_moves_none(tmp_path):
    """`pull` and `rm` reread the config: on `simulated:4GiB,8GiB` with a 3 GiB model on
    the 8 GiB device, a new 4 GiB model goes where most room is left (5 GiB there, 4 on
    the other), a new replicated one to both (1 GiB is left for it there); the loaded
    model stays where it was, and each new one answers from its own device."""
    config = tmp_path / "config.toml"
    head = f'device = "simulated:4GiB,8GiB"\ndata_dir = "{tmp_path}/d"\nlog_dir = "{tmp_path}/l"\n'
    config.write_text(head + TOML_MODEL.format(name="first", weights="3GiB", replicas=1))
    source = ConfigSource(config)
    with live_server(source.settings(), models_source=source) as live:
        before = {row["name"]: row["devices"] for row in live.status()["models"]}
        assert before == {"first": ["simulated:1"]}  # the most room: the 8 GiB one
        added = TOML_MODEL.format(name="big", weights="4GiB", replicas=1)
        added += TOML_MODEL.format(name="both", weights="256MiB", replicas=2)
        config.write_text(config.read_text() + added)
        changes = httpx.post(live.url + "/admin/models/reread", timeout=30).json()
        assert changes["added"] == ["big", "both"] and changes["removed"] == []
        rows = {row["name"]: row for row in live.status()["models"]}
        assert rows["first"]["devices"] == ["simulated:1"]
        assert rows["big"]["devices"] == ["simulated:1"]
        assert sorted(rows["both"]["devices"]) == ["simulated:0", "simulated:1"]
        with httpx.Client(base_url=live.url, timeout=60) as http:
            reply = http.post("/v1/embeddings", json={"model": "big", "input": "w"})
            assert reply.status_code == 200, reply.text
            assert reply.headers["X-Vramgate-Device"] == "simulated:1"
            reply = http.post("/v1/embeddings", json={"model": "both", "input": "w"})
            assert reply.status_code == 200, reply.text
        # a copy loads where a request is sent: the 4 GiB device, whose pool is free, where
        # the 8 GiB one holds 7 GiB of weights
        assert reply.headers["X-Vramgate-Device"] == "simulated:0"
        copies = {r["device"]: r["state"] for r in live.status()["models"][2]["replicas"]}
        assert copies == {"simulated:0": "ready", "simulated:1": "unloaded"}
        for lane in live.fleet.lanes:
            assert lane.device.oom_count == 0
