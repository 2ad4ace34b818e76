"""OpenAI-compatible routes: parse → validated request → the core (fleet) → encode."""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from app.api.chat_images import refuse_unseeing
from app.api.errors import from_validation_errors
from app.api.openai.replies import Reply, admit_choices
from app.api.openai.schemas import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    PredictRequest,
    validate_embedding_request,
    validate_generation_request,
)
from app.api.responses.schemas import ResponsesRequest
from app.core.fleet.fleet import Fleet
from app.core.requests import ValidEmbeddingRequest
from app.core.watch import ClientWatch
from app.core.work import InferenceResult
from app.errors import ClientGone

router = APIRouter(prefix="/v1", tags=["openai"])
RequestT = TypeVar("RequestT", bound=BaseModel)
_STARTED = int(time.time())


def _fleet(request: Request) -> Fleet:
    return request.app.state.fleet


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
    ResponsesRequest,
)
REF = "#/components/schemas/{model}"


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    schema = {"$ref": REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def request_schemas(models: tuple[type[BaseModel], ...] = REQUEST_MODELS) -> dict[str, Any]:
    """The request bodies' schemas and their parts, for the OpenAPI components."""
    components: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=REF)
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    return components


@router.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    fleet = _fleet(request)
    data = []
    for status in fleet.models():
        if status.retired:
            continue
        card = fleet.card(status.name)
        data.append(
            {
                "id": status.name,
                "object": "model",
                "created": _STARTED,
                "owned_by": "vramgate",
                "kind": card.kind,
                "engine": card.engine,
                "capabilities": list(card.capabilities),
                "context_length": card.context_length,
                "state": status.state,
                "aliases": fleet.aliases_of(status.name),  # names that also reach it
            }
        )
    return {"object": "list", "data": data}


@router.post("/embeddings", openapi_extra=openapi_body(EmbeddingRequest))
async def create_embeddings(request: Request) -> Response:
    """Also served by `HotRoutes` (see HOT_ROUTES), past the framework's layers."""

    fleet = _fleet(request)
    try:
        body = EmbeddingRequest.model_validate_json(await read_body(request))
    except ValidationError as exc:
        raise from_validation_errors(exc.errors()) from None
    valid = validate_embedding_request(body, fleet.settings)
    with client_watch(request) as watch:
        result = await fleet.run(valid, watch)
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


@router.post("/chat/completions", openapi_extra=openapi_body(ChatRequest), responses=STREAMED)
async def create_chat_completion(request: Request) -> Response:
    """OpenAI chat completions, streamed as server-sent events with `stream: true`."""
    body = _parse(ChatRequest, await read_body(request))
    return await _complete(request, body, "chat.completion", "chatcmpl")


@router.post("/completions", openapi_extra=openapi_body(CompletionRequest), responses=STREAMED)
async def create_completion(request: Request) -> Response:
    """OpenAI (legacy) text completions, streamed with `stream: true`."""
    body = _parse(CompletionRequest, await read_body(request))
    return await _complete(request, body, "text_completion", "cmpl")


async def _complete(
    request: Request, body: ChatRequest | CompletionRequest, kind: str, prefix: str
) -> Response:
    fleet = _fleet(request)
    images = body.image_count() if isinstance(body, ChatRequest) else 0
    refuse_unseeing(fleet, body.model, images, "messages")  # before any image is read
    valid = validate_generation_request(body, fleet.settings)
    reply = Reply(valid, kind, prefix)
    with client_watch(request) as watch:
        generations = await admit_choices(fleet, valid, watch)
        if not valid.stream:
            return await reply.respond(generations, watch)
    # the stream's response reads the connection itself: the watch has ended
    return reply.stream(generations)


# The routes that carry the load, for app.api.hot.HotRoutes.
HOT_ROUTES = {
    ("POST", "/v1/embeddings"): create_embeddings,
    ("POST", "/v1/chat/completions"): create_chat_completion,
    ("POST", "/v1/completions"): create_completion,
}
