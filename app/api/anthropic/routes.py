"""Anthropic's Messages API (what Claude Code speaks): parse → the same validated chat
request as OpenAI's route → the core (fleet) → encode in Anthropic's shapes. Errors on
these routes leave in Anthropic's shape too (app.api.errors.error_response)."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from app.api.anthropic.replies import MessageReply, reasons
from app.api.anthropic.schemas import CountTokensRequest, MessagesRequest
from app.api.chat_images import refuse_unseeing
from app.api.errors import from_validation_errors
from app.api.openai.replies import admit_choices
from app.api.openai.routes import client_watch, openapi_body, read_body, request_schemas
from app.api.openai.schemas import validate_generation_request
from app.core.fleet.fleet import Fleet
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


def _fleet(request: Request) -> Fleet:
    return request.app.state.fleet


def _parse(model: type[RequestT], body: bytes) -> RequestT:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise from_validation_errors(exc.errors()) from None


def _validated(fleet: Fleet, body: MessagesRequest) -> ValidGenerationRequest:
    """The request as the core takes it; an image for a model that does not see is a
    400 naming the model, after a 404 for a model that is not served."""
    where = body.image_param()
    if where is not None:
        refuse_unseeing(fleet, body.model, 1, where)
    return validate_generation_request(body.as_chat(), fleet.settings)


@router.post("/messages", openapi_extra=openapi_body(MessagesRequest), responses=EVENTS)
async def create_message(request: Request) -> Response:
    """Anthropic's Messages API, streamed as Anthropic streams with `stream: true`."""
    fleet = _fleet(request)
    body = _parse(MessagesRequest, await read_body(request))
    valid = _validated(fleet, body)
    thinking = body.thinking_shown and reasons(fleet.card(body.model).chat_template)
    reply = MessageReply(valid, body.model, thinking)
    with client_watch(request) as watch:
        (generation,) = await admit_choices(fleet, valid, watch)
        if not valid.stream:
            return await reply.respond(generation, watch)
    # the stream's response reads the connection itself: the watch has ended
    return reply.stream(generation)


@router.post(
    "/messages/count_tokens", openapi_extra=openapi_body(CountTokensRequest), responses=COUNTED
)
async def count_message_tokens(request: Request) -> dict[str, int]:
    """The tokens the message's prompt takes; nothing runs on the device."""
    fleet = _fleet(request)
    body = _parse(CountTokensRequest, await read_body(request))
    return {"input_tokens": await fleet.count_tokens(_validated(fleet, body))}
