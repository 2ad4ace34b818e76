"""A generation's answer in OpenAI's shapes: one JSON body, or server-sent event chunks.

A request for `n` choices runs as n streams, each admitted and priced as any stream is (so
they step in one batch where memory allows); its choices carry their `index`, its usage
counts the prompt once and every choice's tokens, and its cost headers add up the n
prices. Seeded requests give choice i the seed + i, so the choices differ and each can
be reproduced.

A reasoning model's thinking comes apart from its answer, as llama.cpp's, vLLM's and
DeepSeek's servers give it: `message.reasoning_content`, streamed as
`delta.reasoning_content` before the answer's `delta.content` (app.models.chat.reasoning);
tool calls are read from the answer only, never from the thinking.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi.responses import Response, StreamingResponse

from app.api.load_wait import after_load
from app.api.thinking import frame_of
from app.core.fleet.fleet import Fleet
from app.core.overflow import said as truncation
from app.core.requests import ValidGenerationRequest
from app.core.watch import ClientWatch
from app.core.work import AdmittedGeneration, Cost
from app.errors import ShuttingDown, VramgateError
from app.models.chat.reasoning import Frame, ThinkSplitter, split
from app.models.decoding import DecodeResult
from app.models.tools import CallWatch, read_calls

DONE = b"data: [DONE]\n\n"


class Reply:
    """One request's answer: its `n` choices' generations, as JSON or as chunks."""

    def __init__(self, body: ValidGenerationRequest, kind: str, prefix: str) -> None:
        self.body = body
        self.chat = kind == "chat.completion"
        self.kind = kind
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.tier = "default"  # the tier it ran in, as OpenAI names it (once admitted)

    async def respond(self, generations: list[AdmittedGeneration], watch: ClientWatch) -> Response:
        """The whole answer as one JSON body. A client that leaves stops every choice
        before its next step, as a stream's does; nobody reads the answer then."""

        def close_all() -> None:
            for generation in generations:
                generation.close()

        self.tier = generations[0].job.priority.service_tier
        watch.on_leave(close_all)  # one callback: the watch keeps the last one given
        try:
            answers = await asyncio.gather(*(_collect(g) for g in generations))
        finally:
            close_all()
        choices = [
            self._choice(index, text, outcome, frame_of(generations[index]))
            for index, (text, outcome, _) in enumerate(answers)
        ]
        payload = self._envelope(self.kind, choices)
        outcomes, cost = [a[1] for a in answers], Cost.combined([a[2] for a in answers])
        payload["usage"] = usage(outcomes, cost)
        return Response(
            orjson.dumps(payload), media_type="application/json", headers=cost.headers()
        )

    def stream(self, generations: list[AdmittedGeneration]) -> Response:
        """Server-sent events as the text is decoded."""
        self.tier = generations[0].job.priority.service_tier
        headers = AdmittedGeneration.admission_headers(generations)
        return StreamingResponse(
            self._events(generations),
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache"},
        )

    def stream_after_load(
        self, fleet: Fleet, admission: asyncio.Future[list[AdmittedGeneration]]
    ) -> Response:
        """Server-sent events that begin while the model loads: its progress as comment
        lines (`: loading NAME: ...`, skipped by SSE parsers: app.api.load_wait), then the
        chunks as `stream` sends them, or the admission's error as an error event."""
        return StreamingResponse(
            self._after_load(fleet, admission),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    def _after_load(
        self, fleet: Fleet, admission: asyncio.Future[list[AdmittedGeneration]]
    ) -> AsyncIterator[bytes]:
        return after_load(
            fleet,
            self.body.model,
            admission,
            lambda words: b": " + words.encode() + b"\n\n",
            lambda exc: _sse(exc.body()) + DONE,
            AdmittedGeneration.close,
            self._answer_after_load,
        )

    def _answer_after_load(self, generations: list[AdmittedGeneration]) -> AsyncIterator[bytes]:
        self.tier = generations[0].job.priority.service_tier
        return self._events(generations)

    async def _events(self, generations: list[AdmittedGeneration]) -> AsyncIterator[bytes]:
        """Chunks as text is decoded, each naming its choice; a choice's last names its
        finish reason; with `include_usage`, a choice-less chunk with the usage follows;
        then `[DONE]`. A failure after the stream started arrives as an error event."""
        chunk = f"{self.kind}.chunk" if self.chat else self.kind
        try:
            if self.chat:
                first = {"role": "assistant", "content": ""}
                roles = [self._delta(i, first) for i in range(len(generations))]
                yield _sse(self._envelope(chunk, roles))
            elif self.body.echo:
                echoes = [self._delta(i, {"text": self.prompt}) for i in range(len(generations))]
                yield _sse(self._envelope(chunk, echoes))
            ended: list[tuple[DecodeResult, Cost]] = []
            # tool mode: text streams once it can be no call; a call is held (CallWatch)
            names = set(self.body.tool_names)
            watches = {i: CallWatch(names) for i in range(len(generations)) if self.tools}
            splitters = [self._splitter(generation) for generation in generations]
            async for index, text in _merged(generations):
                pieces = splitters[index].push(text) if text is not None else []
                if text is None:
                    pieces = splitters[index].end()
                for delta in self._deltas(pieces, watches.get(index)):
                    yield _sse(self._envelope(chunk, [self._delta(index, delta)]))
                if text is not None:
                    continue
                try:
                    outcome, cost = await generations[index].outcome()
                    if outcome.finish_reason == "cancelled":  # stopped by the server
                        raise generations[index].stream.cancel_reason or ShuttingDown(
                            "the server is shutting down; the answer is incomplete"
                        )
                except VramgateError as exc:
                    yield _sse(exc.body())
                    yield DONE
                    return
                ended.append((outcome, cost))
                finish = outcome.finish_reason
                if self.tools:
                    delta, finish = self._held_end(watches[index], finish)
                    if delta:
                        yield _sse(self._envelope(chunk, [self._delta(index, delta)]))
                last = self._delta(index, {}, finish)
                if outcome.logprobs is not None:
                    last["logprobs"] = self._logprobs(outcome, len(self.prompt))
                yield _sse(self._envelope(chunk, [last]))
            if self.body.include_usage:  # OpenAI's shape: only the last, choice-less chunk
                tail = self._envelope(chunk, [])
                tail["usage"] = usage([o for o, _ in ended], Cost.combined([c for _, c in ended]))
                yield _sse(tail)
            yield DONE
        finally:
            for generation in generations:
                generation.close()

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        envelope = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.body.model,
            "choices": choices,
            "service_tier": self.tier,
        }
        if self.body.stream and self.body.include_usage:
            envelope["usage"] = None  # every chunk but the last, as OpenAI sends them
        return envelope

    def _splitter(self, generation: AdmittedGeneration) -> ThinkSplitter:
        """How a choice's text is split into thinking and answer (completions: never)."""
        return ThinkSplitter(frame_of(generation) if self.chat else None)

    def _deltas(
        self, pieces: list[tuple[str, str]], watch: CallWatch | None
    ) -> list[dict[str, Any]]:
        """Deltas for pieces of a choice's text: thinking as `reasoning_content`, the
        answer as content, through the watch for calls where tools are offered."""
        deltas = []
        for kind, piece in pieces:
            if kind == "thinking":
                deltas.append({"reasoning_content": piece})
                continue
            text = watch.feed(piece) if watch is not None else piece
            if text:
                deltas.append(self._content(text))
        return deltas

    @property
    def tools(self) -> bool:
        """Whether answers are read for tool calls (a stream's text held while it may
        still be one: app.models.tools.CallWatch)."""
        return self.chat and self.body.tool_mode != "none"

    def _held_end(self, watch: CallWatch, finish: str) -> tuple[dict[str, Any], str]:
        """A streamed answer's last delta in tool mode: what was held, as content or as
        its tool calls."""
        rest, calls = watch.end()
        calls = calls if self.body.parallel_tool_calls else calls[:1]
        if not calls:
            return ({"content": rest} if rest else {}), finish
        listed = [{"index": i, **call.as_openai()} for i, call in enumerate(calls)]
        return {"content": rest or None, "tool_calls": listed}, "tool_calls"

    def _message(
        self, text: str, finish: str, frame: Frame | None = None
    ) -> tuple[dict[str, Any], str]:
        """The assistant message for `text`: its thinking apart (`reasoning_content`), its
        tool calls where it makes some."""
        thought, text = split(text, frame)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thought:
            message["reasoning_content"] = thought
        if self.tools:
            rest, calls = read_calls(text, set(self.body.tool_names))
            calls = calls if self.body.parallel_tool_calls else calls[:1]
            if calls:
                message["content"] = rest
                message["tool_calls"] = [
                    {"index": i, **call.as_openai()} for i, call in enumerate(calls)
                ]
                return message, "tool_calls"
        return message, finish

    @property
    def prompt(self) -> str:
        """A completion's prompt where the answer echoes it, else nothing."""
        prompt = self.body.prompt
        return prompt if self.body.echo and isinstance(prompt, str) else ""

    def _choice(
        self, index: int, text: str, outcome: DecodeResult, frame: Frame | None
    ) -> dict[str, Any]:
        logprobs = self._logprobs(outcome, len(self.prompt))
        if self.chat:
            message, finish = self._message(text, outcome.finish_reason, frame)
            for call in message.get("tool_calls", []):
                call.pop("index")  # only stream deltas number their calls
            return {
                "index": index,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": _finish(finish),
            }
        return {
            "index": index,
            "text": self.prompt + text,
            "logprobs": logprobs,
            "finish_reason": _finish(outcome.finish_reason),
        }

    def _logprobs(self, outcome: DecodeResult, offset: int) -> dict[str, Any] | None:
        """OpenAI's logprobs: chat's `content` entries, or completions' four lists."""
        if outcome.logprobs is None:
            return None
        if self.chat:
            content = [
                {
                    **_entry(entry.token, entry.logprob),
                    "top_logprobs": [_entry(token, value) for token, value in entry.top],
                }
                for entry in outcome.logprobs
            ]
            return {"content": content, "refusal": None}
        offsets = []
        for entry in outcome.logprobs:
            offsets.append(offset)
            offset += len(entry.token)
        return {
            "tokens": [entry.token for entry in outcome.logprobs],
            "token_logprobs": [entry.logprob for entry in outcome.logprobs],
            "top_logprobs": [dict(entry.top) for entry in outcome.logprobs],
            "text_offset": offsets,
        }

    def _content(self, text: str) -> dict[str, Any]:
        return {"content": text} if self.chat else {"text": text}

    def _delta(
        self, index: int, content: dict[str, Any], finish: str | None = None
    ) -> dict[str, Any]:
        reason = _finish(finish) if finish else None
        if self.chat:
            return {"index": index, "delta": content, "finish_reason": reason}
        return {
            "index": index,
            "text": content.get("text", ""),
            "logprobs": None,
            "finish_reason": reason,
        }


async def _collect(generation: AdmittedGeneration) -> tuple[str, DecodeResult, Cost]:
    text = "".join([delta async for delta in generation.deltas()])
    outcome, cost = await generation.outcome()
    return text, outcome, cost


async def _merged(
    generations: list[AdmittedGeneration],
) -> AsyncIterator[tuple[int, str | None]]:
    """(choice, text) as any choice decodes it, then (choice, None) when it has ended."""
    if len(generations) == 1:  # the common case, without tasks
        async for text in generations[0].deltas():
            yield 0, text
        yield 0, None
        return
    queue: asyncio.Queue[tuple[int, str | None]] = asyncio.Queue()

    async def pump(index: int, generation: AdmittedGeneration) -> None:
        async for text in generation.deltas():
            queue.put_nowait((index, text))
        queue.put_nowait((index, None))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(generations)]
    try:
        for _ in range(len(generations)):
            while (item := await queue.get())[1] is not None:
                yield item
            yield item
    finally:
        for task in tasks:
            task.cancel()


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _finish(reason: str) -> str:
    return reason if reason in ("length", "tool_calls") else "stop"


def usage(outcomes: list[DecodeResult], cost: Cost) -> dict[str, Any]:
    """OpenAI's usage (the prompt once, every choice's tokens) and vramgate's cost."""
    prompt = outcomes[0].prompt_tokens if outcomes else 0
    completion = sum(outcome.completion_tokens for outcome in outcomes)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": outcomes[0].cached_tokens if outcomes else 0},
        "queue_ms": round(cost.queue_s * 1000, 3),
        "run_ms": round(cost.run_s * 1000, 3),
        "vram_bytes": cost.price_bytes,
        **(truncation(outcomes[0]) if outcomes else {}),
        **drafts(outcomes),
    }


def drafts(outcomes: list[DecodeResult]) -> dict[str, int]:
    """Speculative decoding's tokens drafted and accepted, every choice's, as the engine
    reported them (none where it did not speculate)."""
    drafted = [o.draft_tokens for o in outcomes if o.draft_tokens is not None]
    if not drafted:
        return {}
    accepted = sum(o.accepted_tokens or 0 for o in outcomes)
    return {"draft_tokens": sum(drafted), "accepted_tokens": accepted}
