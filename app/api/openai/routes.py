"""OpenAI-compatible routes: parse → validated request → the core (fleet) → encode."""

from __future__ import annotations

import base64
import time
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from app.api.callers import cache_scope
from app.api.intake import (
    STREAMED,
    admit_choices,
    client_watch,
    fleet_of,
    generation_request,
    openapi_body,
    read_parsed,
    request_schemas,
)
from app.api.load_wait import admit_watching
from app.api.openai.replies import Reply
from app.api.openai.schemas import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    PredictRequest,
    validate_embedding_request,
)
from app.core import priority
from app.core.requests import ValidEmbeddingRequest
from app.core.work import InferenceResult

router = APIRouter(prefix="/v1", tags=["openai"])
RequestT = TypeVar("RequestT", bound=BaseModel)
_STARTED = int(time.time())


REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    EmbeddingRequest,
    ChatRequest,
    CompletionRequest,
    PredictRequest,
)


@router.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    fleet = fleet_of(request)
    data = []
    for status in fleet.listed():
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
                # what a request that leaves them out takes (the config's, by Ollama's names)
                "defaults": fleet.spec(status.name).request_defaults(),
            }
        )
        # an alias the config gives a class (`task` for background) is listed on its
        # own, so that an app can choose it where it chooses models from this list (Open
        # WebUI's Task Model)
        for alias in fleet.aliases_of(status.name):
            tier = priority.configured(alias, fleet.settings.priorities)
            if tier is not None and not any(c in alias for c in "*?["):
                data.append(
                    {**data[-1], "id": alias, "alias_of": status.name}
                    | {"aliases": [], "priority": tier.label}
                )
    return {"object": "list", "data": data}


def openai_schemas() -> dict[str, Any]:
    """OpenAI's request bodies' schemas, for the OpenAPI components."""
    return request_schemas(REQUEST_MODELS)


@router.post("/embeddings", openapi_extra=openapi_body(EmbeddingRequest))
async def create_embeddings(request: Request) -> Response:
    """Also served by `HotRoutes` (see HOT_ROUTES), past the framework's layers."""

    fleet = fleet_of(request)
    body = await read_parsed(request, EmbeddingRequest)
    priority.say(body.service_tier, body.priority)
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
@router.post("/chat/completions", openapi_extra=openapi_body(ChatRequest), responses=STREAMED)
async def create_chat_completion(request: Request) -> Response:
    """OpenAI chat completions, streamed as server-sent events with `stream: true`."""
    body = await read_parsed(request, ChatRequest)
    return await _complete(request, body, "chat.completion", "chatcmpl")


@router.post("/completions", openapi_extra=openapi_body(CompletionRequest), responses=STREAMED)
async def create_completion(request: Request) -> Response:
    """OpenAI (legacy) text completions, streamed with `stream: true`."""
    body = await read_parsed(request, CompletionRequest)
    return await _complete(request, body, "text_completion", "cmpl")


async def _complete(
    request: Request, body: ChatRequest | CompletionRequest, kind: str, prefix: str
) -> Response:
    fleet = fleet_of(request)
    priority.say(body.service_tier, body.priority)
    images = body.image_count() if isinstance(body, ChatRequest) else 0
    valid = generation_request(fleet, body, images, scope=cache_scope(request, *body.caller_ids()))
    reply = Reply(valid, kind, prefix)
    with client_watch(request) as watch:
        admission = await admit_watching(fleet, valid.model, admit_choices(fleet, valid, watch))
        if admission.loading and valid.stream:  # the load's progress first (app.api.load_wait)
            return reply.stream_after_load(fleet, admission.task)
        generations = await admission.task
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
