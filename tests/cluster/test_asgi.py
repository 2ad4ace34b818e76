"""A request handed to vramgate's own app in-process (what a cluster replica does with
the ingress's requests), on a simulated device and model (config choices); no Ray."""

from __future__ import annotations

import asyncio

import orjson

from app.api.app import create_app
from app.cluster.asgi import Forwarded, Head, answer
from app.config.settings import ModelSpec, SimulatedBucket, SimulatedGeneration
from tests.support.live import make_settings, wait_until

MiB = 2**20
HOST = ((b"host", b"127.0.0.1:8450"), (b"content-type", b"application/json"))


def chat_model() -> ModelSpec:
    return ModelSpec(
        name="chat",
        kind="simulated",
        buckets=(SimulatedBucket(size=64, bytes=MiB, run_ms=1),),
        generation=SimulatedGeneration(kv_bytes_per_token=64 * 1024, step_ms=20),
    )


def post(path: str, body: dict) -> Forwarded:
    return Forwarded("POST", path, headers=HOST, body=orjson.dumps(body))


async def collect(app, request: Forwarded) -> tuple[Head, list[bytes]]:
    parts = [part async for part in answer(app, request)]
    head = parts[0]
    assert isinstance(head, Head)
    return head, [p for p in parts[1:] if isinstance(p, bytes)]


def test_in_process_answers_stream_and_a_reader_who_leaves_gives_the_stream_back(tmp_path):
    settings = make_settings(tmp_path, device="simulated:1GiB", models=(chat_model(),))
    app = create_app(settings)
    fleet = app.state.fleet

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            await asyncio.to_thread(wait_until, lambda: fleet.ready, 60, "ready")
            # a whole answer, through the same guard and routes as over a socket
            head, body = await collect(app, post("/v1/embeddings", {"model": "chat", "input": "a"}))
            assert head.status == 200 and head.header("x-vramgate-device") == "simulated:0"
            assert len(orjson.loads(b"".join(body))["data"]) == 1
            # the guard still stands: another site's Host is refused
            foreign = Forwarded("GET", "/status", headers=((b"host", b"evil.example"),))
            assert (await collect(app, foreign))[0].status == 403
            # a stream arrives chunk by chunk, as the model steps
            ask = {"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 40, "stream": True}  # fmt: skip
            parts = answer(app, post("/v1/chat/completions", ask))
            first = await parts.__anext__()
            assert isinstance(first, Head) and first.status == 200
            assert (await parts.__anext__()).startswith(b"data: ")
            assert fleet.lanes[0].scheduler.gate.running_streams == 1
            await parts.aclose()  # the reader leaves in the middle of the stream
            await asyncio.to_thread(
                wait_until,
                lambda: fleet.lanes[0].scheduler.gate.running_streams == 0,
                10,
                "the stream's permit back",
            )

    asyncio.run(scenario())


def test_a_request_without_a_client_address_is_not_a_loopback_caller(tmp_path):
    """The ingress hands a replica the caller's address; where it has none, the replica
    must not take the request for one from this machine (its admin routes answer
    loopback callers only). The ingress's own code needs Ray (the cluster extra, absent
    here: its tests skip); the address it forwards is `caller_address`'s, tested here."""
    settings = make_settings(tmp_path, device="simulated:1GiB", models=(chat_model(),))
    app = create_app(settings)
    fleet = app.state.fleet

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            await asyncio.to_thread(wait_until, lambda: fleet.ready, 60, "ready")
            unsaid = Forwarded("POST", "/admin/pause", headers=HOST)  # no client given
            head, body = await collect(app, unsaid)
            assert head.status == 403, body
            assert b"loopback callers only" in b"".join(body)
            assert fleet.status()["paused"] is False
            local = Forwarded("POST", "/admin/pause", headers=HOST, client=("127.0.0.1", 5))
            assert (await collect(app, local))[0].status == 200

    asyncio.run(scenario())
    from starlette.datastructures import Address

    from app.cluster.asgi import caller_address

    assert caller_address(None) is None  # what the ingress forwards for an unknown caller
    assert caller_address(Address("10.1.2.3", 40000)) == ("10.1.2.3", 40000)
