"""A transcript in the shape OpenAI's audio routes answer with: `json` ({"text"}),
`text`, `srt`, `vtt`, `verbose_json` (task, language, duration, segments, and words where
they were asked for) and, when streamed, server-sent `transcript.text.delta` events and
one `transcript.text.done`."""

from __future__ import annotations

import math
import zlib
from collections.abc import AsyncIterator
from typing import Any, Literal

import orjson
from fastapi.responses import Response, StreamingResponse

from app.core.work import InferenceResult
from app.models.transcript import Segment, Transcript

ResponseFormat = Literal["json", "text", "srt", "vtt", "verbose_json"]
FORMATS: tuple[str, ...] = ("json", "text", "srt", "vtt", "verbose_json")


def usage(result: InferenceResult, transcript: Transcript) -> dict[str, Any]:
    """OpenAI's duration usage, with what the request cost here beside it."""
    cost = result.cost
    return {
        "type": "duration",
        "seconds": math.ceil(transcript.duration),
        "windows": transcript.windows,
        "queue_ms": round(cost.queue_s * 1000, 3),
        "run_ms": round(cost.run_s * 1000, 3),
        "vram_bytes": cost.price_bytes,
        "batch": cost.batch,
    }


def reply(result: InferenceResult, response_format: ResponseFormat) -> Response:
    transcript: Transcript = result.output
    headers = result.cost.headers()
    if response_format == "text":
        return Response(transcript.text, media_type="text/plain", headers=headers)
    if response_format == "srt":
        return Response(srt(transcript.segments), media_type="text/plain", headers=headers)
    if response_format == "vtt":
        return Response(vtt(transcript.segments), media_type="text/vtt", headers=headers)
    body: dict[str, Any] = {"text": transcript.text, "usage": usage(result, transcript)}
    if response_format == "verbose_json":
        body = {**verbose(transcript), **body}
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)


def verbose(transcript: Transcript) -> dict[str, Any]:
    """verbose_json's fields. Whisper's per-segment log probabilities and no-speech
    probability are not computed here: those fields are null."""
    segments: list[dict[str, Any]] = [
        {
            "id": index,
            "seek": int(segment.start // 30) * 3000,  # the window's first mel frame
            "start": segment.start,
            "end": segment.end,
            "text": segment.text,
            "tokens": [],
            "temperature": transcript.temperature,
            "avg_logprob": None,
            "compression_ratio": compression_ratio(segment.text),
            "no_speech_prob": None,
        }
        for index, segment in enumerate(transcript.segments)
    ]
    found: dict[str, Any] = {
        "task": transcript.task,
        "language": language_name(transcript.language),
        "duration": transcript.duration,
        "segments": segments,
    }
    if transcript.words:  # asked for (timestamp_granularities[]=word)
        found["words"] = [
            {"word": word.text, "start": word.start, "end": word.end} for word in transcript.words
        ]
    return found


def language_name(code: str | None) -> str | None:
    """OpenAI names the language (`english`); None where the model detected it."""
    if code is None:
        return None
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return str(LANGUAGES.get(code, code))


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return round(len(data) / len(zlib.compress(data)), 3) if data else 0.0


def _clock(seconds: float, separator: str) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def srt(segments: tuple[Segment, ...]) -> str:
    cues = [
        f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n"
        for i, s in enumerate(segments, start=1)
    ]
    return "\n".join(cues)


def vtt(segments: tuple[Segment, ...]) -> str:
    cues = [
        f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n" for s in segments
    ]
    return "\n".join(["WEBVTT\n", *cues])


def streamed(result: InferenceResult) -> StreamingResponse:
    """The transcript as OpenAI's server-sent events: a delta per segment (or the whole
    text where there are none), then the done event with the text. The
    windows are decoded together, so the events come once the transcript is whole."""
    transcript: Transcript = result.output
    pieces = [s.text for s in transcript.segments] or [transcript.text]

    async def events() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield _event({"type": "transcript.text.delta", "delta": piece, "logprobs": None})
        # no usage: OpenAI's done event counts tokens (`input_tokens`, ...; typed clients
        # require them), and a duration is not that; the cost is in the headers
        yield _event({"type": "transcript.text.done", "text": transcript.text, "logprobs": None})

    headers = {**result.cost.headers(), "Cache-Control": "no-cache"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"
