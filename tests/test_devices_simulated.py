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

from app.errors import DeviceUnavailable
from app.manage import format_status
from app.settings import ModelSpec, SimulatedBucket
from tests.live import live_server, make_settings

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
    limits = httpx.Limits(max_connections=clients)
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
