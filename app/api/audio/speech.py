"""Text to speech in OpenAI's shape: `POST /v1/audio/speech` (`model`, `input`, `voice`,
`response_format`, `speed`, `instructions`, `stream_format`), answered with the audio as
it is spoken.

The input is split at sentence ends into parts (app.api.audio.parts); each part is a
request of its own, priced and queued as any (a few at a time, so they batch together),
and each part's audio is encoded and sent once it and those before it are spoken: the
first sentence is heard before the last is spoken. Every field is checked before anything
is queued; the first part is awaited before the answer starts, so a refusal (503, 400 for
a voice the model lacks) is a status of its own. A client that leaves stops what has not
run of its request. `stream_format` `sse`: OpenAI's `speech.audio.delta` events (base64
audio) and one `speech.audio.done` with the usage."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from app.api.audio.encode import MEDIA_TYPES, SpeechEncoder
from app.api.audio.parts import SpokenParts, split_parts
from app.api.intake import client_watch, fleet_of, openapi_body, read_parsed
from app.api.openai.schemas import KeepAlive
from app.config.settings import MODEL_NAME_PATTERN
from app.core.fleet.fleet import Fleet
from app.core.requests import ValidSpeech
from app.core.work import InferenceResult
from app.models.kinds import Speech, Utterance

router = APIRouter(prefix="/v1/audio", tags=["audio"])

MAX_INPUT_CHARS = 4096  # OpenAI's bound on `input`
VoiceName = Annotated[str, Field(min_length=1, max_length=64)]


class VoiceId(BaseModel):
    """OpenAI's custom voice reference: its `id` is taken as a voice name."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=64)


class SpeechRequest(BaseModel):
    """OpenAI's speech request, and vramgate's `seed` (the speech's noise: the same seed,
    the same audio) and `keep_alive`."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(max_length=64, pattern=MODEL_NAME_PATTERN)
    input: str = Field(min_length=1, max_length=MAX_INPUT_CHARS)
    voice: VoiceName | VoiceId = "alloy"
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    instructions: str | None = Field(default=None, max_length=MAX_INPUT_CHARS)
    stream_format: Literal["audio", "sse"] = "audio"
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    keep_alive: KeepAlive = None

    @property
    def voice_name(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceId) else self.voice


@router.post(
    "/speech",
    openapi_extra=openapi_body(SpeechRequest),
    summary="Speak text",
    response_class=StreamingResponse,
)
async def speech(request: Request) -> StreamingResponse:
    fleet: Fleet = fleet_of(request)
    body = await read_parsed(request, SpeechRequest)
    parts = speech_parts(body)
    spoken = SpokenParts(fleet, parts)
    try:
        with client_watch(request) as watch:
            first = await spoken.first(watch)
    except BaseException:
        await spoken.close()
        raise
    warnings = list(first.warnings)
    if body.instructions:
        warnings.append("instructions are not used: this server's speech models take none.")
    headers = {**first.cost.headers(), "X-Vramgate-Parts": str(len(parts))}
    if warnings:
        headers["X-Vramgate-Warning"] = " ".join(warnings)
    encoder = SpeechEncoder(body.response_format)
    if body.stream_format == "sse":
        events = _events(fleet, encoder, spoken, first)
        headers["Cache-Control"] = "no-cache"
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    chunks = _audio(fleet, encoder, spoken, first)
    return StreamingResponse(chunks, media_type=MEDIA_TYPES[body.response_format], headers=headers)


def speech_parts(body: SpeechRequest) -> list[ValidSpeech]:
    """The input's parts as requests; the first carries the whole input, checked once."""
    texts = split_parts(body.input)
    voice, model = body.voice_name, body.model
    return [
        ValidSpeech(
            model,
            Utterance(text, voice, body.speed, body.seed),
            whole=body.input if index == 0 else None,
            keep_alive=body.keep_alive,
        )
        for index, text in enumerate(texts)
    ]


def _samples(result: InferenceResult) -> Speech:
    rows: list[Speech] = list(result.output)
    return rows[0]


async def _audio(
    fleet: Fleet, encoder: SpeechEncoder, spoken: SpokenParts, first: InferenceResult
) -> AsyncIterator[bytes]:
    """Each part's audio once it is spoken, then the container's end."""
    try:
        async for result in spoken.rest(first):
            speech = _samples(result)
            chunk = await fleet.run_cpu(encoder.feed, speech.samples, speech.rate)
            if chunk:
                yield chunk
        yield await fleet.run_cpu(encoder.close)
    finally:
        await spoken.close()


async def _events(
    fleet: Fleet, encoder: SpeechEncoder, spoken: SpokenParts, first: InferenceResult
) -> AsyncIterator[bytes]:
    """OpenAI's server-sent speech events: a delta of base64 audio per part, then done
    with the usage (the input's tokens; audio is no tokens here: output_tokens 0)."""
    tokens = 0
    try:
        async for result in spoken.rest(first):
            tokens += result.tokens
            speech = _samples(result)
            chunk = await fleet.run_cpu(encoder.feed, speech.samples, speech.rate)
            if chunk:
                yield _event({"type": "speech.audio.delta", "audio": _b64(chunk)})
        tail = await fleet.run_cpu(encoder.close)
        if tail:
            yield _event({"type": "speech.audio.delta", "audio": _b64(tail)})
        usage = {"input_tokens": tokens, "output_tokens": 0, "total_tokens": tokens}
        yield _event({"type": "speech.audio.done", "usage": usage})
    finally:
        await spoken.close()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"
