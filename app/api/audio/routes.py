"""Speech to text in OpenAI's shape: `POST /v1/audio/transcriptions` and
`/v1/audio/translations` (to English), multipart uploads (`file`, `model`, `language`,
`prompt`, `response_format`, `temperature`, `timestamp_granularities[]`, `stream`).
Every field is checked here, before anything is queued; the file is decoded by its
model's preprocess on the CPU pool (not audio, or too long: 400, nothing queued)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.datastructures import FormData, UploadFile

from app.api.audio.replies import FORMATS, ResponseFormat, reply, streamed
from app.api.intake import (
    client_watch,
    fleet_of,
)
from app.config.durations import parse_keep_alive
from app.config.settings import MODEL_NAME_PATTERN
from app.core.fleet.fleet import Fleet
from app.core.requests import ValidTranscription
from app.errors import InvalidRequest, UnsupportedMediaType
from app.models.audio import SpeechOptions, Task, audio_memory_full

router = APIRouter(prefix="/v1/audio", tags=["audio"])

MAX_PROMPT_CHARS = 2_000  # Whisper reads at most 224 tokens of prompt
LANGUAGE = re.compile(r"^[a-z]{2,3}$")
MODEL = re.compile(MODEL_NAME_PATTERN)
GRANULARITIES = ("segment", "word")

FIELDS: dict[str, Any] = {
    "file": {"type": "string", "format": "binary"},
    "model": {  # empty or left out: the one speech model served
        "type": "string",
        "anyOf": [{"pattern": MODEL_NAME_PATTERN}, {"maxLength": 0}],
    },
    "prompt": {"type": "string", "maxLength": MAX_PROMPT_CHARS},
    "response_format": {"type": "string", "enum": list(FORMATS), "default": "json"},
    "temperature": {"type": "number", "minimum": 0, "maximum": 1, "default": 0},
    "stream": {"type": "boolean", "default": False},
    "keep_alive": {"type": "string"},
}


def _openapi(*, language: bool) -> dict[str, Any]:
    properties = dict(FIELDS)
    if language:
        properties["language"] = {"type": "string", "pattern": LANGUAGE.pattern}
        properties["timestamp_granularities[]"] = {
            "type": "array",
            "items": {"type": "string", "enum": list(GRANULARITIES)},
        }
    schema = {"type": "object", "required": ["file"], "properties": properties}
    return {
        "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}
    }


@router.post("/transcriptions", openapi_extra=_openapi(language=True), summary="Transcribe audio")
async def transcriptions(request: Request) -> Response:
    return await _answer(request, "transcribe")


@router.post(
    "/translations", openapi_extra=_openapi(language=False), summary="Translate audio to English"
)
async def translations(request: Request) -> Response:
    return await _answer(request, "translate")


async def _answer(request: Request, task: Task) -> Response:
    fleet: Fleet = fleet_of(request)
    valid, response_format, stream = await read_audio(
        request, task, fleet.settings.max_audio_seconds
    )
    # the upload and its decoded samples count against max_audio_bytes until it is answered
    with fleet.audio_bytes.lease() as lease, client_watch(request) as watch:
        if not lease.take(len(valid.audio)):
            raise audio_memory_full(len(valid.audio), lease)
        result = await fleet.run(replace(valid, lease=lease), watch)
    return streamed(result) if stream else reply(result, response_format)


async def read_audio(
    request: Request, task: Task, max_seconds: float
) -> tuple[ValidTranscription, ResponseFormat, bool]:
    """The upload as a validated request, its response format and whether it streams."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "multipart/form-data":
        raise UnsupportedMediaType("send the audio as multipart/form-data (a `file` field)")
    form = await request.form(max_files=1, max_fields=16)
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidRequest("send the audio as the `file` field", param="file")
        audio = await upload.read()
        fields = _fields(form, task)
    finally:
        await form.close()
    if not audio:
        raise InvalidRequest("the audio file is empty", param="file")
    model, options, response_format, stream, keep = fields
    return ValidTranscription(model, audio, options, max_seconds, keep), response_format, stream


def _text(form: FormData, name: str, limit: int = 64) -> str | None:
    value = form.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise InvalidRequest(f"`{name}` must be text of at most {limit} characters", param=name)
    return value


def _fields(
    form: FormData, task: Task
) -> tuple[str, SpeechOptions, ResponseFormat, bool, float | None]:
    model = _text(form, "model") or ""  # empty: the one speech model (app.core.fleet.names)
    if model and not MODEL.match(model):
        raise InvalidRequest("`model` must name a served model", param="model")
    language = _text(form, "language") if task == "transcribe" else None
    if language is not None and not LANGUAGE.match(language):
        raise InvalidRequest(
            f"language {language!r} is no ISO-639-1 code (en, fr, ...)", param="language"
        )
    response_format = _text(form, "response_format") or "json"
    if response_format not in FORMATS:
        raise InvalidRequest(
            f"response_format must be one of {', '.join(FORMATS)}", param="response_format"
        )
    stream = _flag(form, "stream")
    words = _granularities(form, response_format, stream)
    prompt = _text(form, "prompt", MAX_PROMPT_CHARS) or None
    options = SpeechOptions(task, language, prompt, _temperature(form), words)
    keep = _keep_alive(_text(form, "keep_alive", 32))
    return model, options, response_format, stream, keep  # type: ignore[return-value]


def _granularities(form: FormData, response_format: str, stream: bool) -> bool:
    """Whether word timestamps are asked for (segments are always timed). Words come
    only in verbose_json, as OpenAI's: asked for elsewhere, or streamed, a 400."""
    asked = [*form.getlist("timestamp_granularities[]"), *form.getlist("timestamp_granularities")]
    for value in asked:
        if value not in GRANULARITIES:
            raise InvalidRequest(
                "timestamp_granularities may hold segment and word",
                param="timestamp_granularities",
            )
    words = "word" in asked
    if words and (response_format != "verbose_json" or stream):
        raise InvalidRequest(
            "word timestamps come in response_format verbose_json, not streamed",
            param="timestamp_granularities",
        )
    return words


def _keep_alive(value: str | None) -> float | None:
    try:
        return None if value is None else parse_keep_alive(value)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="keep_alive") from None


def _temperature(form: FormData) -> float:
    value = _text(form, "temperature", 16)
    if value is None or value == "":
        return 0.0
    try:
        temperature = float(value)
    except ValueError:
        temperature = -1.0
    if not 0.0 <= temperature <= 1.0:
        raise InvalidRequest("temperature must be a number from 0 to 1", param="temperature")
    return temperature


def _flag(form: FormData, name: str) -> bool:
    value = (_text(form, name, 8) or "false").lower()
    if value not in ("true", "false", "1", "0"):
        raise InvalidRequest(f"`{name}` must be true or false", param=name)
    return value in ("true", "1")
