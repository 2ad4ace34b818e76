"""The ingress's own decisions, without Ray running: which refusals move to another
replica, and how a stream ends whose replica was lost after it began."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

pytest.importorskip("ray.serve", reason="the cluster extra (Linux only)")
from ray.exceptions import ActorDiedError

from app.cluster import ingress
from app.cluster.asgi import Head
from app.cluster.replica import REPLICA_HEADER


def refusal(code: str, status: int = 503) -> tuple[Head, bytes]:
    head = Head(status, [(REPLICA_HEADER.encode(), b"r1")])
    error = {"message": "no", "type": "server_error", "param": None, "code": code}
    return head, orjson.dumps({"error": error})


def moves(head: Head, body: bytes) -> bool:
    """Whether the ingress sends the request on (no router yet: up to MAX_TRIES)."""
    another: Any = ingress.Ingress.func_or_class._another  # the class under Ray's wrapper
    return bool(another(None, head, body, []))


@pytest.mark.parametrize(
    "code", ["model_runner_stopped", "model_runner_failed", "queue_full", "device_failed"]
)
def test_a_refusal_another_replica_may_not_give_moves(code):
    # a GGUF model's runner that ended or failed is that replica's: another's may be sound
    assert moves(*refusal(code))


@pytest.mark.parametrize(("code", "status"), [("model_not_found", 404), ("invalid_request", 400)])
def test_a_refusal_every_replica_gives_is_the_answer(code, status):
    assert not moves(*refusal(code, status))


async def lost_after(*parts: bytes) -> AsyncIterator[bytes]:
    """A replica's stream that sends `parts`, then is lost (its machine left)."""
    for part in parts:
        yield part
    raise ActorDiedError()


def rest(path: str, media: str) -> list[bytes]:
    async def read() -> list[bytes]:
        stream = ingress._rest(lost_after(b"first\n"), path, media)  # type: ignore[arg-type]
        return [part async for part in stream]

    return asyncio.run(read())


def test_an_openai_stream_whose_replica_is_lost_ends_with_an_error_event_and_done():
    first, end = rest("/v1/chat/completions", "text/event-stream; charset=utf-8")
    assert first == b"first\n"
    event, done = end.decode().split("\n\n")[:2]
    error = orjson.loads(event.removeprefix("data: "))["error"]
    assert error["code"] == "device_failed" and error["type"] == "server_error"
    assert done == "data: [DONE]"


def test_other_event_streams_end_with_an_error_event():
    # Anthropic's /v1/messages and the images stream name their error event
    _, end = rest("/v1/messages", "text/event-stream; charset=utf-8")
    name, data = end.decode().strip().split("\n")
    assert name == "event: error"
    assert orjson.loads(data.removeprefix("data: "))["error"]["code"] == "device_failed"


def test_an_ollama_stream_ends_with_its_error_line():
    _, end = rest("/api/chat", "application/x-ndjson")
    line = orjson.loads(end)
    assert line["code"] == "device_failed" and isinstance(line["error"], str)


def test_a_raw_stream_has_no_error_event_its_connection_closes_before_its_end():
    with pytest.raises(ActorDiedError):
        rest("/v1/audio/speech", "audio/mpeg")
