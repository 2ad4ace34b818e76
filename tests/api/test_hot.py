"""The hot routes (plain ASGI) answer exactly as the same routes through FastAPI's layers,
against the simulated device and simulated model."""

from __future__ import annotations

import socket

import httpx
import pytest

from app.config.settings import FaultInjection, ModelSpec, SimulatedBucket

MiB = 2**20


def sim_model(error_on_calls: tuple[int, ...] = ()) -> ModelSpec:
    return ModelSpec(
        name="sim",
        kind="simulated",
        buckets=(SimulatedBucket(size=64, bytes=8 * MiB, run_ms=1),),
        inject=FaultInjection(error_on_calls=error_on_calls),
    )


REQUESTS = [
    {"model": "sim", "input": ["one two three", "four"]},
    {"model": "sim", "input": "five six", "encoding_format": "base64"},
    {"model": "sim", "input": "x", "dimensions": 3},  # 400: the model makes 64
    {"model": "nope", "input": "x"},  # 404 model_not_found
    {"model": "sim", "input": " ".join(["w"] * 100)},  # 400: over the largest bucket
    {"model": "sim", "input": []},  # 400: empty
    {"model": "sim", "input": "x", "extra": 1},  # 400: unknown field
]
VOLATILE = ("x-vramgate-queue-ms", "x-vramgate-run-ms", "date", "content-length")  # timings


def answers(live) -> list[tuple[int, dict, dict]]:
    out = []
    with live.client() as client:
        for request in REQUESTS:
            r = client.post("/v1/embeddings", json=request)
            body = r.json()
            body.get("usage", {}).pop("queue_ms", None)
            body.get("usage", {}).pop("run_ms", None)
            headers = {k: v for k, v in r.headers.items() if k not in VOLATILE}
            out.append((r.status_code, headers, body))
        bad = client.post(
            "/v1/embeddings", content=b"{not json", headers={"Content-Type": "application/json"}
        )

        out.append((bad.status_code, {}, bad.json()))
    return out


def test_simulated_hot_routes_answer_like_the_framework_routes(server_factory, tmp_path):
    hot = answers(server_factory(device="simulated:1GiB", models=[sim_model()]))
    framework = answers(
        server_factory(device="simulated:1GiB", models=[sim_model()], hot_routes=False)
    )
    assert [status for status, _, _ in hot] == [200, 200, 400, 404, 400, 400, 400, 400]
    assert hot == framework


@pytest.mark.parametrize("hot_routes", [True, False])
def test_simulated_handler_exception_is_a_generic_500_on_both_paths(server_factory, hot_routes):
    # Call 1 is the warm-up at start, call 2 the readiness probe's or ours: fail several.
    live = server_factory(
        device="simulated:1GiB",
        models=[sim_model(error_on_calls=tuple(range(2, 50)))],
        hot_routes=hot_routes,
        health_interval=3600,
    )
    r = httpx.post(live.url + "/v1/embeddings", json={"model": "sim", "input": "x"}, timeout=30)
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "internal_error"
    assert "injected" not in r.text  # the cause is logged, not sent
    assert live.service.scheduler.gate.held_bytes == 0 and live.service.scheduler.gate.depth == 0


@pytest.mark.parametrize("hot_routes", [True, False])
def test_simulated_client_leaving_mid_body_is_no_server_error(server_factory, hot_routes, caplog):
    live = server_factory(device="simulated:1GiB", models=[sim_model()], hot_routes=hot_routes)
    host, port = live.url.removeprefix("http://").split(":")
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    with caplog.at_level("ERROR"), socket.create_connection((host, int(port))) as sock:
        sock.sendall(head + b'{"model": "sim", "input": "')  # ... and hangs up
    r = httpx.post(live.url + "/v1/embeddings", json={"model": "sim", "input": "x"}, timeout=30)
    assert r.status_code == 200
    assert not [rec for rec in caplog.records if rec.levelname == "ERROR"]
    assert live.service.scheduler.gate.held_bytes == 0 and live.service.scheduler.gate.depth == 0
