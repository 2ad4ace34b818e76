"""The intake every API's routes share: the body read once, parsed into its bounded type
(a 4xx that says what is wrong, nothing queued), the one watch on the client's
connection, and for generations the step each chat API repeats: its request translated
into chat's (`chat_request()`), checked, validated and admitted, every choice or none.

Bodies are read and validated here, in pydantic's Rust JSON validator, rather than by
FastAPI's body machinery (a tenth of the event loop's time per request); their schemas
go into the OpenAPI document's components (`request_schemas`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from app.api.chat_images import refuse_unseeing
from app.api.errors import from_validation_errors
from app.api.openai.schemas import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    validate_generation_request,
)
from app.config.model_spec import ModelSpec
from app.core.fleet.fleet import Fleet
from app.core.overflow import Overflow
from app.core.requests import ValidGenerationRequest
from app.core.watch import ClientWatch
from app.core.work import AdmittedGeneration, InferenceResult
from app.errors import ClientGone

BodyT = TypeVar("BodyT", bound=BaseModel)
REF = "#/components/schemas/{model}"
# a route's answer: one JSON body, or with `stream: true` server-sent events
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


def fleet_of(request: Request) -> Fleet:
    return request.app.state.fleet  # type: ignore[no-any-return]


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


def parsed(model: type[BodyT], body: bytes) -> BodyT:
    """`body` as `model`, or the 4xx its first problem makes."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise from_validation_errors(exc.errors()) from None


async def read_parsed(request: Request, model: type[BodyT]) -> BodyT:
    return parsed(model, await read_body(request))


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    schema = {"$ref": REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def request_schemas(models: tuple[type[BaseModel], ...]) -> dict[str, Any]:
    """The request bodies' schemas and their parts, for the OpenAPI components."""
    components: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=REF)
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    return components


# -- generations -----------------------------------------------------------------------
def generation_request(
    fleet: Fleet,
    body: ChatRequest | CompletionRequest,
    images: int = 0,
    images_at: str = "messages",
    *,
    scope: str = "",
    fit_context: bool = False,
    overflow: Overflow = "error",
) -> ValidGenerationRequest:
    """A chat or completion as the core takes it, whichever API it came through (its
    `chat_request()`): an image for a model that does not see is a 400 naming the model,
    after a 404 for a model that is not served, before any image is read. `scope`: its
    caller's, whose cached prefixes alone it may reuse (app.api.callers.cache_scope).
    `fit_context`: a `max_tokens` past the context stops there (Ollama's way) instead
    of being refused. `overflow`: what a chat past the context gets on this route where
    its model's `context_overflow` is `auto` (app.core.overflow)."""
    refuse_unseeing(fleet, body.model, images, images_at)
    spec = fleet.spec(body.model)
    body = with_model_defaults(body, spec)
    valid = validate_generation_request(body, fleet.settings)
    params = replace(valid.params, cache_scope=scope, fit_context=fit_context)
    chosen = overflow if spec.context_overflow == "auto" else spec.context_overflow
    return replace(valid, params=params, overflow=chosen)


# the config's names of a model's sampling defaults, as chat's fields (ModelSpec)
_AS_CHAT_FIELD = {"repeat_penalty": "repetition_penalty"}


def with_model_defaults(
    body: ChatRequest | CompletionRequest, spec: ModelSpec
) -> ChatRequest | CompletionRequest:
    """The request with its model's sampling defaults where it leaves them out: each
    API's request is chat's by now (its `chat_request()`, which sets only what the
    caller set), so this is the one place they are applied. The model's `system` goes
    first in a chat that has no system message of its own (as Ollama's SYSTEM)."""
    asked = body.model_fields_set
    update: dict[str, Any] = {}
    for name, value in spec.sampling_defaults().items():
        field = _AS_CHAT_FIELD.get(name, name)
        if field not in asked:
            update[field] = list(value) if name == "stop" else value
    if (
        spec.system
        and isinstance(body, ChatRequest)
        and not any(m.role in ("system", "developer") for m in body.messages)
    ):
        system = ChatMessage(role="system", content=spec.system)
        update["messages"] = [system, *body.messages]
    return body.model_copy(update=update) if update else body


def choice_requests(valid: ValidGenerationRequest) -> list[ValidGenerationRequest]:
    """One request per choice: choice i of a seeded request samples with seed + i."""
    if valid.n == 1:
        return [valid]
    seed = valid.params.seed
    return [
        replace(valid, params=replace(valid.params, seed=None if seed is None else seed + i))
        for i in range(valid.n)
    ]


async def admit_choices(
    fleet: Fleet, valid: ValidGenerationRequest, watch: ClientWatch
) -> list[AdmittedGeneration]:
    """Every choice admitted, or none: a choice that is refused closes the others."""
    if valid.n == 1:
        return [await fleet.generate(valid, watch)]
    tasks = [asyncio.ensure_future(fleet.generate(one, watch)) for one in choice_requests(valid)]
    failed: list[BaseException] = []
    try:
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:  # also when this request is cancelled meanwhile: nothing admitted is left running
        ended = [t for t in tasks if t.done() and not t.cancelled()]
        admitted = [t.result() for t in ended if t.exception() is None]
        failed = [error for t in ended if (error := t.exception()) is not None]
        if failed or len(ended) < len(tasks):
            for task in tasks:
                task.cancel()
            for generation in admitted:
                generation.close()
    if failed:
        raise failed[0]
    return admitted


# -- what a one-shot request cost, as `usage` -------------------------------------------
def pixel_usage(result: InferenceResult) -> dict[str, Any]:
    """An image request's `usage`: its pixels, and what it cost."""
    cost = result.cost
    return {
        "pixels": result.tokens,
        "queue_ms": round(cost.queue_s * 1000, 3),
        "run_ms": round(cost.run_s * 1000, 3),
        "vram_bytes": cost.price_bytes,
        "batch": cost.batch,
    }
