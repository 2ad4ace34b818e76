"""OpenAI-compatible routes: parse → validated request → service → encode."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from app.api.errors import from_validation_errors
from app.api.schemas import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    PredictRequest,
    validate_embedding_request,
    validate_generation_request,
)
from app.core.requests import ValidEmbeddingRequest, ValidGenerationRequest
from app.core.service import InferenceService
from app.core.watch import ClientWatch
from app.core.work import AdmittedGeneration, Cost, InferenceResult
from app.errors import ClientGone, ShuttingDown, VramgateError
from app.models.decoding import DecodeResult

router = APIRouter(prefix="/v1", tags=["openai"])
RequestT = TypeVar("RequestT", bound=BaseModel)
_STARTED = int(time.time())


def _service(request: Request) -> InferenceService:
    return request.app.state.service


def disconnected(request: Request) -> Callable[[], Awaitable[None]]:
    """Waits until the client goes away (the body has been read already)."""

    async def wait() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    return wait


def client_watch(request: Request) -> ClientWatch:
    """The request's one disconnect watch; the core starts it only when a request has
    to wait, so most requests never pay for it."""
    return ClientWatch(disconnected(request))


async def read_body(request: Request) -> bytes:
    """The whole body, read once, straight from the ASGI channel. Starlette's
    `request.body()` goes through an async generator that cost a sixth of the event
    loop's time per request on the embeddings route."""
    chunks = []
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientGone("the client disconnected while sending its request")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# Bodies are read and validated here, in pydantic's Rust JSON validator, rather than by
# FastAPI's body machinery (a tenth of the event loop's time per request); their schemas
# go into the OpenAPI document's components (see `request_schemas`).
REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    EmbeddingRequest,
    ChatRequest,
    CompletionRequest,
    PredictRequest,
)
REF = "#/components/schemas/{model}"


def _openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    schema = {"$ref": REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def request_schemas() -> dict[str, Any]:
    """The request bodies' schemas and their parts, for the OpenAPI components."""
    components: dict[str, Any] = {}
    for model in REQUEST_MODELS:
        schema = model.model_json_schema(ref_template=REF)
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    return components


@router.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    entries = _service(request).registry.describe()
    data = [
        {
            "id": e["name"],
            "object": "model",
            "created": _STARTED,
            "owned_by": "vramgate",
            "kind": e["kind"],
            "state": e["state"],
        }
        for e in entries
    ]
    return {"object": "list", "data": data}


@router.post("/embeddings", openapi_extra=_openapi_body(EmbeddingRequest))
async def create_embeddings(request: Request) -> Response:
    """Also served by `HotRoutes` (see HOT_ROUTES), past the framework's layers."""

    service = _service(request)
    try:
        body = EmbeddingRequest.model_validate_json(await read_body(request))
    except ValidationError as exc:
        raise from_validation_errors(exc.errors()) from None
    valid = validate_embedding_request(body, service.settings)
    with client_watch(request) as watch:
        result = await service.embed(valid, watch)
    return Response(
        encode_embeddings(valid, result),
        media_type="application/json",
        headers=result.cost.headers(),
    )


def encode_embeddings(valid: ValidEmbeddingRequest, result: InferenceResult) -> bytes:
    vectors = result.output
    if valid.encoding_format == "base64":
        rows: list[Any] = [
            base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in vectors
        ]
    else:
        rows = list(vectors)
    cost = result.cost
    payload = {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)
        ],
        "model": valid.model,
        "usage": {
            "prompt_tokens": result.tokens,
            "total_tokens": result.tokens,
            "queue_ms": round(cost.queue_s * 1000, 3),
            "run_ms": round(cost.run_s * 1000, 3),
            "vram_bytes": cost.price_bytes,
            "batch": cost.batch,
        },
    }
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


# -- text generation -------------------------------------------------------------------
def _parse(model: type[RequestT], body: bytes) -> RequestT:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise from_validation_errors(exc.errors()) from None


STREAMED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the completion; with `stream: true`, server-sent events",
        "content": {
            "text/event-stream": {
                "schema": {  # each event: a JSON chunk, or [DONE] at the end
                    "type": "object",
                    "required": ["data"],
                    "properties": {"data": {"type": "string"}},
                }
            }
        },
    }
}


@router.post("/chat/completions", openapi_extra=_openapi_body(ChatRequest), responses=STREAMED)
async def create_chat_completion(request: Request) -> Response:
    """OpenAI chat completions, streamed as server-sent events with `stream: true`."""
    body = _parse(ChatRequest, await read_body(request))
    return await _complete(request, body, "chat.completion", "chatcmpl")


@router.post("/completions", openapi_extra=_openapi_body(CompletionRequest), responses=STREAMED)
async def create_completion(request: Request) -> Response:
    """OpenAI (legacy) text completions, streamed with `stream: true`."""
    body = _parse(CompletionRequest, await read_body(request))
    return await _complete(request, body, "text_completion", "cmpl")


async def _complete(
    request: Request, body: ChatRequest | CompletionRequest, kind: str, prefix: str
) -> Response:
    service = _service(request)
    valid = validate_generation_request(body, service.settings)
    reply = Reply(valid, kind, prefix)
    with client_watch(request) as watch:
        generation = await service.generate(valid, watch)
        if not valid.stream:
            return await reply.respond(generation, watch)
    # the stream's response reads the connection itself: the watch has ended
    return reply.stream(generation)


class Reply:
    """One generation's answer in OpenAI's shapes: a JSON body, or SSE chunks."""

    def __init__(self, body: ValidGenerationRequest, kind: str, prefix: str) -> None:
        self.body = body
        self.chat = kind == "chat.completion"
        self.kind = kind
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    async def respond(self, generation: AdmittedGeneration, watch: ClientWatch) -> Response:
        """The whole answer as one JSON body. A client that leaves stops the generation
        before its next step, as a stream's does; nobody reads the answer then."""
        watch.on_leave(generation.close)
        try:
            text = "".join([delta async for delta in generation.deltas()])
            outcome, cost = await generation.outcome()
        finally:
            generation.close()
        payload = self._envelope(self.kind, [self._choice(text, outcome.finish_reason)])
        payload["usage"] = usage(outcome, cost)
        return Response(
            orjson.dumps(payload), media_type="application/json", headers=cost.headers()
        )

    def stream(self, generation: AdmittedGeneration) -> Response:
        """Server-sent events as the text is decoded."""
        return StreamingResponse(
            self._events(generation),
            media_type="text/event-stream",
            headers={**generation.admission_headers(), "Cache-Control": "no-cache"},
        )

    async def _events(self, generation: AdmittedGeneration) -> AsyncIterator[bytes]:
        """Chunks as text is decoded; the last names the finish reason; with
        `include_usage`, a choice-less chunk with the usage follows; then `[DONE]`. A
        failure after the stream started arrives as an error event."""
        chunk = f"{self.kind}.chunk" if self.chat else self.kind
        try:
            if self.chat:
                yield _sse(
                    self._envelope(chunk, [self._delta({"role": "assistant", "content": ""})])
                )
            async for text in generation.deltas():
                yield _sse(self._envelope(chunk, [self._delta(self._content(text))]))
            try:
                outcome, cost = await generation.outcome()
                if outcome.finish_reason == "cancelled":  # stopped by the server
                    raise generation.stream.cancel_reason or ShuttingDown(
                        "the server is shutting down; the answer is incomplete"
                    )
            except VramgateError as exc:
                yield _sse(exc.body())
                yield DONE
                return
            yield _sse(self._envelope(chunk, [self._delta({}, outcome.finish_reason)]))
            if self.body.include_usage:  # OpenAI's shape: only the last, choice-less chunk
                tail = self._envelope(chunk, [])
                tail["usage"] = usage(outcome, cost)
                yield _sse(tail)
            yield DONE
        finally:
            generation.close()

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        envelope = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.body.model,
            "choices": choices,
        }
        if self.body.stream and self.body.include_usage:
            envelope["usage"] = None  # every chunk but the last, as OpenAI sends them
        return envelope

    def _choice(self, text: str, finish: str) -> dict[str, Any]:
        if self.chat:
            message = {"role": "assistant", "content": text}
            return {"index": 0, "message": message, "finish_reason": _finish(finish)}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": _finish(finish)}

    def _content(self, text: str) -> dict[str, Any]:
        return {"content": text} if self.chat else {"text": text}

    def _delta(self, content: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        reason = _finish(finish) if finish else None
        if self.chat:
            return {"index": 0, "delta": content, "finish_reason": reason}
        return {
            "index": 0,
            "text": content.get("text", ""),
            "logprobs": None,
            "finish_reason": reason,
        }


DONE = b"data: [DONE]\n\n"


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def usage(outcome: DecodeResult, cost: Cost) -> dict[str, Any]:
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
        "queue_ms": round(cost.queue_s * 1000, 3),
        "run_ms": round(cost.run_s * 1000, 3),
        "vram_bytes": cost.price_bytes,
    }


# The routes that carry the load, for app.api.hot.HotRoutes.
HOT_ROUTES = {
    ("POST", "/v1/embeddings"): create_embeddings,
    ("POST", "/v1/chat/completions"): create_chat_completion,
    ("POST", "/v1/completions"): create_completion,
}
