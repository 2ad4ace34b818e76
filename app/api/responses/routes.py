"""OpenAI's Responses API (Codex CLI, the Agents SDK): parse → the chat request it makes
(app.api.responses.schemas) → the same validation, admission and constrained decoding
as chat (app.api.openai.schemas, app.api.openai.replies) → a Response object or its events
(app.api.responses.replies); stored answers in app.api.responses.store."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from app.api.callers import cache_scope
from app.api.intake import (
    REF,
    STREAMED,
    admit_choices,
    client_watch,
    fleet_of,
    generation_request,
    parsed,
    read_body,
    request_schemas,
)
from app.api.load_wait import admit_watching, after_load
from app.api.responses.fields import screen
from app.api.responses.replies import EventWriter, OnDone, ResponseDraft, events, whole
from app.api.responses.schemas import (
    ITEMS,
    InputItem,
    ResponsesRequest,
    drop_oldest_turn,
    dumped_items,
    has_image,
    in_responses_terms,
)
from app.api.responses.store import (
    ResponseStore,
    StoredResponse,
    check_response_id,
)
from app.core import priority
from app.core.fleet.fleet import Fleet
from app.core.requests import ValidGenerationRequest
from app.core.watch import ClientWatch
from app.core.work import AdmittedGeneration
from app.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    PreviousResponseNotFound,
    ResponseNotFound,
    VramgateError,
    WrongModelKind,
)

log = logging.getLogger("vramgate.responses")
router = APIRouter(prefix="/v1", tags=["openai"])
# an admitted answer: the items it was given (fewer where truncation dropped turns), the
# chat request they made, its generation
Admitted = tuple[list[InputItem], ValidGenerationRequest, AdmittedGeneration]


# the body is validated here, not by FastAPI (as openai_routes' are); its schema is in the
# OpenAPI document's components (openai_routes.REQUEST_MODELS)
_BODY = {"$ref": REF.format(model=ResponsesRequest.__name__)}
_OPENAPI = {"requestBody": {"required": True, "content": {"application/json": {"schema": _BODY}}}}


def responses_schemas() -> dict[str, Any]:
    """The request body's schema and its parts, for the OpenAPI components."""
    return request_schemas((ResponsesRequest,))


def _store(request: Request) -> ResponseStore:
    return request.app.state.responses


@router.post("/responses", openapi_extra=_OPENAPI, responses=STREAMED)
async def create_response(request: Request) -> Response:
    """A model's answer to `input` (after `previous_response_id`'s conversation), as a
    Response object, or its events with `stream: true`."""
    fleet, store = fleet_of(request), _store(request)
    raw = await read_body(request)
    body = parsed(ResponsesRequest, raw)
    priority.say(body.service_tier)
    _log_ignored(raw)
    items = [*await _previous(store, body.previous_response_id), *body.items()]
    if has_image(items):
        card = fleet.card(body.model)  # 404 for a model not served
        if "vision" in card.capabilities:
            raise InvalidRequest(
                f"input_image is not supported on /v1/responses yet; model {body.model!r} "
                "sees images sent through /v1/chat/completions (image_url data URLs)",
                param="input",
            )
        raise WrongModelKind(
            f"model {body.model!r} cannot see images: input_image needs a vision chat "
            f"model, and this one reads text ({', '.join(card.capabilities)})",
            param="input",
        )
    with client_watch(request) as watch:
        scope = cache_scope(request, *body.caller_ids())
        admitting = _admitted(fleet, body, items, scope, watch)
        admission = await admit_watching(fleet, body.model, admitting)
        if admission.loading and body.stream:  # the load's progress first (app.api.load_wait)
            return StreamingResponse(
                _events_after_load(fleet, store, body, admission.task),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        ((items, valid, generation),) = await admission.task
        draft = _draft(body, valid, generation)
        on_done = _on_done(store, body, items)
        if not body.stream:
            watch.on_leave(generation.close)
            try:
                finished, cost = await whole(draft, generation)
            finally:
                generation.close()
            await on_done(finished)
            return Response(
                orjson.dumps(finished), media_type="application/json", headers=cost.headers()
            )
    # the stream's response reads the connection itself: the watch has ended
    headers = AdmittedGeneration.admission_headers([generation])
    return StreamingResponse(
        events(draft, generation, on_done),
        media_type="text/event-stream",
        headers={**headers, "Cache-Control": "no-cache"},
    )


def _draft(
    body: ResponsesRequest, valid: ValidGenerationRequest, generation: AdmittedGeneration
) -> ResponseDraft:
    """The Response an admitted generation makes, in the tier its admission settled."""
    draft = ResponseDraft(body, valid)
    draft.tier = generation.job.priority.service_tier
    return draft


def _on_done(store: ResponseStore, body: ResponsesRequest, items: list[InputItem]) -> OnDone:
    """What follows a finished answer: stored with the items it was given, if asked."""

    async def on_done(finished: dict[str, Any]) -> None:
        if body.store:  # a thread: the file can be megabytes of JSON
            await asyncio.to_thread(_save, store, StoredResponse(finished, dumped_items(items)))

    return on_done


def _events_after_load(
    fleet: Fleet,
    store: ResponseStore,
    body: ResponsesRequest,
    admission: asyncio.Future[list[Admitted]],
) -> AsyncIterator[bytes]:
    """Events that begin while the model loads: its progress as comment lines (`: loading
    NAME: ...`, which SSE parsers skip), then the answer's events, or the admission's
    refusal as the stream's `error` event (its status was sent: 200)."""

    def answer(admitted: list[Admitted]) -> AsyncIterator[bytes]:
        ((items, valid, generation),) = admitted
        return events(_draft(body, valid, generation), generation, _on_done(store, body, items))

    def refuse(exc: VramgateError) -> bytes:
        error = {"code": exc.code, "message": exc.message, "param": exc.param}
        return EventWriter()("error", **error)

    return after_load(
        fleet,
        body.model,
        admission,
        lambda words: b": " + words.encode() + b"\n\n",
        refuse,
        lambda admitted: admitted[2].close(),
        answer,
    )


@router.get("/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> dict[str, Any]:
    return (await _stored(_store(request), response_id)).response


@router.delete("/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> dict[str, Any]:
    check_response_id(response_id, "response_id")
    if not await asyncio.to_thread(_store(request).delete, response_id):
        raise _not_found(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/responses/{response_id}/input_items")
async def list_input_items(
    request: Request,
    response_id: str,
    limit: int = Query(20, ge=1, le=100),
    order: Literal["asc", "desc"] = "desc",
    after: str | None = Query(None, max_length=128),
) -> dict[str, Any]:
    """The items the model was shown before its answer, newest first unless `asc`."""
    items = (await _stored(_store(request), response_id)).input
    items = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item.get("id") for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }


def _save(store: ResponseStore, stored: StoredResponse) -> None:
    """Stored, or said in the log (as the store says one too big): the answer is given
    either way (a later previous_response_id naming it is a 404 then)."""
    try:
        store.save(stored)
    except OSError as exc:
        log.error("response %s could not be stored in %s: %s", stored.id, store.folder, exc)


async def _stored(store: ResponseStore, response_id: str) -> StoredResponse:
    check_response_id(response_id, "response_id")
    stored = await asyncio.to_thread(store.load, response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored


def _not_found(response_id: str) -> ResponseNotFound:
    return ResponseNotFound(
        f"no response {response_id!r} is stored here (never stored, deleted, or the "
        "oldest beyond max_stored_responses or max_stored_response_bytes)",
        param="response_id",
    )


async def _previous(store: ResponseStore, response_id: str | None) -> list[InputItem]:
    """The conversation `previous_response_id` continues: its input, then its output."""
    if response_id is None:
        return []
    check_response_id(response_id, "previous_response_id")
    stored = await asyncio.to_thread(store.load, response_id)
    if stored is None:
        raise PreviousResponseNotFound(
            f"previous response {response_id!r} is not stored here (never stored, "
            "deleted, or the oldest beyond max_stored_responses or "
            "max_stored_response_bytes)",
            param="previous_response_id",
        )
    return ITEMS.validate_python(stored.conversation())


async def _admitted(
    fleet: Fleet, body: ResponsesRequest, items: list[InputItem], scope: str, watch: ClientWatch
) -> list[Admitted]:
    """The generation admitted, with the items it was given (one, in a list as
    app.api.load_wait takes admissions): with `truncation: auto`, the oldest turns go,
    one at a time, until the prompt fits the model's context. `scope`: its caller's
    (app.api.callers.cache_scope)."""
    while True:
        try:
            valid = generation_request(fleet, body.chat_request(items), scope=scope)
            (generation,) = await admit_choices(fleet, valid, watch)
            return [(items, valid, generation)]
        except ContextLengthExceeded as exc:
            shorter = drop_oldest_turn(items) if body.truncation == "auto" else None
            if shorter is None:
                raise in_responses_terms(exc) from None
            items = shorter
        except InvalidRequest as exc:
            raise in_responses_terms(exc) from None


def _log_ignored(raw: bytes) -> None:
    """The fields taken out as ignored (debug: what a client such as Codex sends)."""
    if log.isEnabledFor(logging.DEBUG):
        ignored = screen(orjson.loads(raw))[1]
        if ignored:
            log.debug("responses: fields accepted and ignored: %s", ", ".join(ignored))
