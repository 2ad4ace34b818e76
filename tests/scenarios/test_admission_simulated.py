"""Admission over real HTTP, against the simulated device and simulated model."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import httpx

from app.config.settings import FaultInjection, ModelSpec, SimulatedBucket
from tests.support.live import wait_until

MiB = 2**20


def sim(*buckets: tuple[int, int, float], inject: FaultInjection | None = None) -> ModelSpec:
    return ModelSpec(
        name="sim",
        kind="simulated",
        buckets=tuple(SimulatedBucket(size=s, bytes=b, run_ms=ms) for s, b, ms in buckets),
        inject=inject or FaultInjection(),
    )


def words(n: int) -> str:
    return " ".join(["w"] * n)


async def post_many(url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return await asyncio.gather(*(client.post("/v1/embeddings", json=b) for b in bodies))


def body(n_words: int = 1) -> dict:
    return {"model": "sim", "input": words(n_words)}


def prices(live) -> dict[str, int]:
    model = next(m for m in live.status()["models"] if m["name"] == "sim")
    return {p["bucket"]: p["price_bytes"] for p in model["prices"]}


def test_simulated_full_queue_gets_503_with_retry_after_and_reasons(server_factory):
    live = server_factory(
        device="simulated:1GiB",
        models=(sim((16, 100 * MiB, 400)),),
        max_concurrent=1,
        max_queue=1,
    )
    responses = asyncio.run(post_many(live.url, [body()] * 4))
    codes = sorted(r.status_code for r in responses)
    assert codes == [200, 200, 503, 503]
    for refused in (r for r in responses if r.status_code == 503):
        assert int(refused.headers["Retry-After"]) >= 1
        error = refused.json()["error"]
        assert error["code"] == "queue_full" and error["reason"] == "queue_full"
        assert error["queue_depth"] == 1 and error["estimated_wait_s"] > 0
    assert live.status()["counters"]["rejected"] == {"queue_full": 2}


def test_simulated_deadline_in_queue_gets_504(server_factory):
    live = server_factory(
        device="simulated:1GiB",
        models=(sim((16, 100 * MiB, 1500)),),
        max_concurrent=1,
        queue_timeout=0.3,
    )
    responses = asyncio.run(post_many(live.url, [body(), body()]))
    assert sorted(r.status_code for r in responses) == [200, 504]
    late = next(r for r in responses if r.status_code == 504)
    assert late.json()["error"]["code"] == "queue_timeout"
    assert int(late.headers["Retry-After"]) >= 1
    assert live.status()["queue"]["depth"] == 0


def test_simulated_job_that_never_fits_gets_413_with_bytes(server_factory):
    live = server_factory(
        device="simulated:1GiB",
        models=(sim((16, 100 * MiB, 10), (64, 2048 * MiB, 10)),),
    )
    response = httpx.post(live.url + "/v1/embeddings", json=body(50), timeout=30)
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "exceeds_device_memory"
    assert error["needed_bytes"] > error["available_bytes"] == 1024 * MiB
    assert live.status()["queue"]["depth"] == 0
    ok = httpx.post(live.url + "/v1/embeddings", json=body(), timeout=30)
    assert ok.status_code == 200


def test_simulated_client_gone_while_queued_never_runs(server_factory):
    live = server_factory(
        device="simulated:1GiB", models=(sim((16, 100 * MiB, 1500)),), max_concurrent=1
    )
    handler = live.service.registry.entries["sim"].handler
    calls_before = handler.forward_calls

    async def scenario() -> int:
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            first = asyncio.create_task(client.post("/v1/embeddings", json=body()))
            await asyncio.to_thread(
                wait_until, lambda: live.service.scheduler.gate.running == 1, 10, "first running"
            )
            await asyncio.to_thread(queue_one_and_hang_up, live.url)
            return (await first).status_code

    assert asyncio.run(scenario()) == 200
    assert handler.forward_calls == calls_before + 1  # the abandoned job never ran
    status = live.status()
    assert status["queue"]["depth"] == 0 and status["pool"]["admitted_bytes"] == 0
    assert status["counters"]["rejected"].get("client_disconnected") == 1


def post_and_hang_up(url: str, until: Callable[[], bool], what: str) -> None:
    """One embeddings request over a raw socket, closed once `until()` holds."""
    host, port = url.removeprefix("http://").split(":")
    payload = b'{"model": "sim", "input": "w"}'
    request = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(request)
        wait_until(until, 10, what)


def queue_one_and_hang_up(url: str) -> None:
    def depth() -> int:
        return httpx.get(url + "/status").json()["queue"]["depth"]

    post_and_hang_up(url, lambda: depth() == 1, "queued")
    wait_until(lambda: depth() == 0, 10, "dequeued")


def test_simulated_injected_oom_gets_503_then_service_continues_at_a_higher_price(
    server_factory,
):
    buckets = ((16, 100 * MiB, 5), (64, 300 * MiB, 5))
    warmups = len(buckets)
    live = server_factory(
        device="simulated:2GiB",
        models=(sim(*buckets, inject=FaultInjection(oom_on_calls=(warmups + 2,))),),
    )
    before = prices(live)["w16"]
    with live.client() as client:
        first = client.post("/v1/embeddings", json=body())
        failed = client.post("/v1/embeddings", json=body())
        after = [client.post("/v1/embeddings", json=body()) for _ in range(3)]
    assert first.status_code == 200
    assert failed.status_code == 503 and int(failed.headers["Retry-After"]) >= 1
    assert failed.json()["error"]["code"] == "out_of_memory"
    assert [r.status_code for r in after] == [200, 200, 200]
    assert prices(live)["w16"] > before
    assert live.status()["counters"]["ooms"] == 1


def test_simulated_requests_waiting_behind_an_oom_take_its_raised_price(server_factory):
    """One slot, one input a run: the first request holds the slot while three of its
    bucket wait; the second runs out of memory (injected). The two after it are admitted
    with the price the out-of-memory raised, not the one quoted when they arrived:
    before, each was let into the room that had just proved too small (a flood's one
    overrun became nine out-of-memory errors)."""
    spec = ModelSpec(
        name="sim",
        kind="simulated",
        buckets=(SimulatedBucket(size=16, bytes=100 * MiB, run_ms=300),),
        inject=FaultInjection(oom_on_calls=(3,)),  # call 1 is the warm-up, 2 the first
        max_batch=1,
    )
    live = server_factory(device="simulated:2GiB", models=(spec,), max_concurrent=1)
    quoted = prices(live)["w16"]

    def queue(field: str) -> int:
        return live.status()["queue"][field]

    async def four() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            first = asyncio.create_task(client.post("/v1/embeddings", json=body()))
            await asyncio.to_thread(wait_until, lambda: queue("running") == 1, 10, "running")
            rest = [asyncio.create_task(client.post("/v1/embeddings", json=body())) for _ in "abc"]
            await asyncio.to_thread(wait_until, lambda: queue("depth") == 3, 10, "three waiting")
            return [await first, *await asyncio.gather(*rest)]

    first, *rest = asyncio.run(four())
    assert first.status_code == 200
    assert sorted(r.status_code for r in rest) == [200, 200, 503]  # whichever ran second
    failed = next(r for r in rest if r.status_code == 503)
    assert failed.json()["error"]["code"] == "out_of_memory"
    after = [r for r in rest if r.status_code == 200]
    price = [int(r.headers["X-Vramgate-Price-Bytes"]) for r in (first, *after)]
    assert price[0] == quoted
    # both admitted with the raised price (the clean run between wears it down only for
    # what is quoted after it)
    assert price[1] == price[2] > quoted


def test_simulated_pool_follows_memory_taken_by_another_program(server_factory):
    live = server_factory(device="simulated:1GiB", models=(sim((16, 600 * MiB, 5)),))
    device = live.service.device
    device.set_external(600 * MiB)  # a game starts
    wait_until(lambda: live.status()["pool"]["pool_bytes"] == 424 * MiB, 5, "pool shrinks")

    async def scenario() -> int:
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            pending = asyncio.create_task(client.post("/v1/embeddings", json=body()))
            await asyncio.to_thread(
                wait_until, lambda: live.service.scheduler.gate.depth == 1, 10, "waiting for memory"
            )
            device.set_external(0)  # the game quits
            return (await pending).status_code

    assert asyncio.run(scenario()) == 200
    assert device.oom_count == 0


def test_simulated_fatal_device_error_fails_over_to_restart(server_factory):
    live = server_factory(
        device="simulated:1GiB",
        models=(sim((16, 100 * MiB, 5), inject=FaultInjection(fatal_on_calls=(2,))),),
    )
    response = httpx.post(live.url + "/v1/embeddings", json=body(), timeout=30)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "device_failed"
    assert live.fatal_calls, "the process was asked to exit"
    health = httpx.get(live.url + "/health")
    assert health.status_code == 503 and health.json()["state"] == "failed"
    again = httpx.post(live.url + "/v1/embeddings", json=body(), timeout=30)
    assert again.status_code == 503


def test_simulated_waiting_requests_run_together_as_one_batch(server_factory):
    live = server_factory(
        device="simulated:1GiB",
        models=(sim((16, 10 * MiB, 300), (64, 40 * MiB, 300)),),
        max_concurrent=1,
    )
    handler = live.service.registry.entries["sim"].handler
    calls_before = handler.forward_calls
    responses = asyncio.run(post_many(live.url, [body(2)] * 8))
    assert [r.status_code for r in responses] == [200] * 8
    batches = sorted(int(r.headers["X-Vramgate-Batch"]) for r in responses)
    assert batches[-1] > 1  # those that waited behind the first ran together
    assert handler.forward_calls - calls_before < 8
    assert [r.json()["usage"]["batch"] for r in responses] == [
        int(r.headers["X-Vramgate-Batch"]) for r in responses
    ]
    status = live.status()
    assert status["counters"]["ooms"] == 0 and status["pool"]["admitted_bytes"] == 0


def test_simulated_batch_wait_gathers_requests_that_would_each_run_at_once(server_factory):
    live = server_factory(
        device="simulated:1GiB",
        models=(sim((16, 10 * MiB, 20)),),
        max_concurrent=4,
        max_batch_wait_ms=1000,
    )
    handler = live.service.registry.entries["sim"].handler
    calls_before = handler.forward_calls
    responses = asyncio.run(post_many(live.url, [body(1)] * 3))
    assert [r.status_code for r in responses] == [200] * 3
    assert [int(r.headers["X-Vramgate-Batch"]) for r in responses] == [3, 3, 3]
    assert handler.forward_calls - calls_before == 1
    assert live.status()["pool"]["admitted_bytes"] == 0


def test_simulated_client_gone_while_running_is_counted_and_the_permit_comes_back(
    server_factory,
):
    live = server_factory(
        device="simulated:1GiB", models=(sim((16, 100 * MiB, 1500)),), max_concurrent=1
    )
    handler = live.service.registry.entries["sim"].handler
    calls_before = handler.forward_calls
    post_and_hang_up(live.url, lambda: live.service.scheduler.gate.running == 1, "running")
    # gone while its forward runs: the run finishes, its permit comes back, one count
    wait_until(
        lambda: live.status()["counters"]["rejected"].get("client_disconnected") == 1,
        10,
        "counted",
    )
    wait_until(lambda: live.service.scheduler.gate.running == 0, 10, "run over")
    assert handler.forward_calls == calls_before + 1
    assert live.status()["pool"]["admitted_bytes"] == 0
    assert httpx.post(live.url + "/v1/embeddings", json=body(), timeout=30).status_code == 200
