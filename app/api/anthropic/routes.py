"""Anthropic's Messages API (what Claude Code speaks): parse → the same validated chat
request as OpenAI's route → the core (fleet) → encode in Anthropic's shapes. Errors on
these routes leave in Anthropic's shape too (app.api.errors.error_response)."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from app.api.anthropic.replies import MessageReply
from app.api.anthropic.schemas import CountTokensRequest, MessagesRequest
from app.api.callers import cache_scope
from app.api.intake import (
    admit_choices,
    client_watch,
    fleet_of,
    generation_request,
    openapi_body,
    read_parsed,
    request_schemas,
)
from app.api.load_wait import admit_watching
from app.core.requests import ValidGenerationRequest

router = APIRouter(prefix="/v1", tags=["anthropic"])
RequestT = TypeVar("RequestT", bound=MessagesRequest)
REQUEST_MODELS: tuple[type[BaseModel], ...] = (MessagesRequest, CountTokensRequest)

EVENTS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the message; with `stream: true`, Anthropic's server-sent events",
        "content": {
            "text/event-stream": {
                "schema": {  # each event: `event: <name>` and its JSON `data`
                    "type": "object",
                    "required": ["event", "data"],
                    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
                }
            }
        },
    }
}
COUNTED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the prompt's tokens, as the model's chat template renders it",
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["input_tokens"],
                    "properties": {"input_tokens": {"type": "integer"}},
                }
            }
        },
    }
}


def anthropic_schemas() -> dict[str, Any]:
    """The request bodies' schemas, for the OpenAPI components."""
    return request_schemas(REQUEST_MODELS)


def _validated(request: Request, body: MessagesRequest) -> ValidGenerationRequest:
    """The request as the core takes it; an image for a model that does not see is a
    400 naming the model, after a 404 for a model that is not served."""
    where, user = body.image_param(), body.metadata.user_id if body.metadata else None
    return generation_request(
        fleet_of(request),
        body.chat_request(),
        where is not None,
        where or "",
        scope=cache_scope(request, user),
    )


@router.post("/messages", openapi_extra=openapi_body(MessagesRequest), responses=EVENTS)
async def create_message(request: Request) -> Response:
    """Anthropic's Messages API, streamed as Anthropic streams with `stream: true`."""
    fleet = fleet_of(request)
    body = await read_parsed(request, MessagesRequest)
    valid = _validated(request, body)
    reply = MessageReply(valid, body.model, body.thinking_shown)
    with client_watch(request) as watch:
        admission = await admit_watching(fleet, valid.model, admit_choices(fleet, valid, watch))
        if admission.loading and valid.stream:  # the load's progress first (app.api.load_wait)
            return reply.stream_after_load(fleet, admission.task)
        (generation,) = await admission.task
        if not valid.stream:
            return await reply.respond(generation, watch)
    # the stream's response reads the connection itself: the watch has ended
    return reply.stream(generation)


@router.post(
    "/messages/count_tokens", openapi_extra=openapi_body(CountTokensRequest), responses=COUNTED
)
async def count_message_tokens(request: Request) -> dict[str, int]:
    """The tokens the message's prompt takes; nothing runs on the device."""
    fleet = fleet_of(request)
    body = await read_parsed(request, CountTokensRequest)
    return {"input_tokens": await fleet.count_tokens(_validated(request, body))}
