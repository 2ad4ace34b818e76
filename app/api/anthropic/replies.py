"""A generation's answer in Anthropic's Messages shapes: one message, or the events of
its stream (message_start, content_block_start / ping / content_block_delta /
content_block_stop per block, message_delta, message_stop; a failure after the stream
began as an `error` event).

The answer's text is read as app.api.openai.replies reads it for OpenAI: a reasoning
model's thinking split from it (app.models.chat.reasoning.ThinkSplitter) as a thinking block
where the request asks for thinking (left out where it does not), the text, its tool
calls (`read_calls` on the text, never the thinking, where tools are offered) as
`tool_use` blocks. Text streams as it is decoded; with tools offered, what may still be
a call is held (app.models.tools.CallWatch) and its blocks sent at the end (a call is
only known whole).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi.responses import Response, StreamingResponse

from app.api.errors import anthropic_body
from app.api.load_wait import after_load
from app.api.thinking import frame_of
from app.core.fleet.fleet import Fleet
from app.core.overflow import said as truncation
from app.core.requests import ValidGenerationRequest
from app.core.watch import ClientWatch
from app.core.work import AdmittedGeneration, Cost
from app.errors import ShuttingDown, VramgateError
from app.models.chat.reasoning import Frame, Piece, ThinkSplitter, split
from app.models.decoding import DecodeResult
from app.models.tools import CallWatch, ToolCall, read_calls

PING_EVERY_S = 10.0  # a held answer (tools offered) sends nothing else until its end


def usage(outcome: DecodeResult) -> dict[str, Any]:
    """Anthropic's usage: `input_tokens` are the prompt's tokens not read from the cache."""
    cached = outcome.cached_tokens
    return {
        "input_tokens": outcome.prompt_tokens - cached,
        "output_tokens": outcome.completion_tokens,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
        **truncation(outcome),
    }


@dataclass(frozen=True)
class Ending:
    """How an answer ended: its blocks (held answers), stop reason and stop string."""

    stop_reason: str
    stop_sequence: str | None


class MessageReply:
    """One request's answer, as Anthropic's message or its stream of events."""

    def __init__(self, valid: ValidGenerationRequest, asked: str, thinking: bool) -> None:
        self.valid = valid
        self.asked = asked  # the model name the client asked for (an alias, maybe)
        self.thinking = thinking  # a reasoning model's thinking as thinking blocks (else left out)
        self.id = f"msg_{uuid.uuid4().hex[:24]}"

    @property
    def tools(self) -> bool:
        return self.valid.tool_mode != "none"

    # -- one message ------------------------------------------------------------------
    async def respond(self, generation: AdmittedGeneration, watch: ClientWatch) -> Response:
        watch.on_leave(generation.close)  # a client that leaves stops it before its next step
        try:
            text = "".join([delta async for delta in generation.deltas()])
            outcome, cost = await _outcome(generation)
        finally:
            generation.close()
        content, ending = self.blocks(text, outcome, frame_of(generation))
        message = self._message(content, ending.stop_reason, ending.stop_sequence)
        message["usage"] = usage(outcome)
        return Response(
            orjson.dumps(message), media_type="application/json", headers=cost.headers()
        )

    def blocks(
        self, text: str, outcome: DecodeResult, frame: Frame | None
    ) -> tuple[list[dict[str, Any]], Ending]:
        """The answer's content blocks, and how it ended."""
        thought, rest = split(text, frame)
        content: list[dict[str, Any]] = []
        if thought and self.thinking:
            content.append({"type": "thinking", "thinking": thought, "signature": ""})
        calls: list[ToolCall] = []
        if self.tools:
            left, calls = read_calls(rest, set(self.valid.tool_names))
            rest = (left or "") if calls else rest
        return self._with_calls(content, rest, calls, outcome)

    def held_blocks(
        self, watch: CallWatch, outcome: DecodeResult
    ) -> tuple[list[dict[str, Any]], Ending]:
        """A streamed answer's last blocks in tool mode: its text still held, its calls."""
        rest, calls = watch.end()
        return self._with_calls([], rest, calls, outcome, streamed=True)

    def _with_calls(
        self,
        content: list[dict[str, Any]],
        rest: str,
        calls: list[ToolCall],
        outcome: DecodeResult,
        *,
        streamed: bool = False,
    ) -> tuple[list[dict[str, Any]], Ending]:
        """`content` with the text left and a tool_use block per call; a whole answer
        with nothing else gets an empty text block (a stream's writer adds its own)."""
        calls = calls if self.valid.parallel_tool_calls else calls[:1]
        if rest or not (content or calls or streamed):
            content.append({"type": "text", "text": rest})
        for call in calls:
            arguments = orjson.loads(call.arguments)
            tool_id = "toolu_" + call.id.removeprefix("call_")
            content.append(
                {"type": "tool_use", "id": tool_id, "name": call.name, "input": arguments}
            )
        return content, _ending(outcome, bool(calls))

    def _message(
        self, content: list[dict[str, Any]], stop_reason: str | None, stop_sequence: str | None
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.asked,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
        }

    # -- a stream of events -----------------------------------------------------------
    def stream(self, generation: AdmittedGeneration) -> Response:
        headers = AdmittedGeneration.admission_headers([generation])
        return StreamingResponse(
            self._events(generation),
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-cache"},
        )

    def stream_after_load(
        self, fleet: Fleet, admission: asyncio.Future[list[AdmittedGeneration]]
    ) -> Response:
        """Events that begin while the model loads: a ping each second (Anthropic's own
        keep-alive, which its clients skip) after a comment line that says the load's
        progress (app.api.load_wait); then the message's events as `stream` sends them,
        or the admission's error as an error event."""
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
            self.valid.model,
            admission,
            lambda words: b": " + words.encode() + b"\n" + _event("ping", {"type": "ping"}),
            lambda exc: _event("error", anthropic_body(exc)),
            AdmittedGeneration.close,
            lambda generations: self._events(generations[0]),
        )

    async def _events(self, generation: AdmittedGeneration) -> AsyncIterator[bytes]:
        blocks = BlockWriter()
        try:
            start = self._message([], None, None)
            start["usage"] = {
                "input_tokens": generation.job.prepared.tokens,  # the cached part: at the end
                "output_tokens": 0,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            }
            yield _event("message_start", {"type": "message_start", "message": start})
            splitter = ThinkSplitter(frame_of(generation))
            # tool mode: text streams once it can be no call; a call is held (CallWatch)
            watch = CallWatch(set(self.valid.tool_names)) if self.tools else None
            async for delta in _with_pings(generation.deltas(), PING_EVERY_S):
                if delta is None:
                    yield _event("ping", {"type": "ping"})
                    continue
                for event in self._pieces(blocks, splitter.push(delta), watch):
                    yield event
            outcome, _ = await _outcome(generation)
            events = list(self._pieces(blocks, splitter.end(), watch))
            if watch is not None:
                content, ending = self.held_blocks(watch, outcome)
                events += [event for block in content for event in blocks.whole(block)]
            else:
                ending = _ending(outcome, False)
            for event in [*events, *blocks.close()]:
                yield event
            stop = {"stop_reason": ending.stop_reason, "stop_sequence": ending.stop_sequence}
            tail = {"type": "message_delta", "delta": stop, "usage": usage(outcome)}
            yield _event("message_delta", tail)
            yield _event("message_stop", {"type": "message_stop"})
        except VramgateError as exc:
            yield _event("error", anthropic_body(exc))
        finally:
            generation.close()

    def _pieces(
        self, blocks: BlockWriter, pieces: list[Piece], watch: CallWatch | None
    ) -> Iterator[bytes]:
        """Thinking into its block (where asked for); text into its block, through the
        watch for calls where tools are offered (what may be one is held)."""
        for kind, piece in pieces:
            if kind == "thinking" and not self.thinking:
                continue
            if kind == "text" and watch is not None:
                piece = watch.feed(piece)
                if not piece:
                    continue
            yield from blocks.piece(kind, piece)


class BlockWriter:
    """Content blocks as events: each opened (and the first followed by a ping, as
    Anthropic's streams are), its deltas, and closed before the next opens."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # the kind of the block being written
        self.pinged = False

    def piece(self, kind: str, text: str) -> Iterator[bytes]:
        """Text of `kind`, into the open block if it is of that kind, else a new one."""
        if self.open != kind:
            start = {"type": "thinking", "thinking": "", "signature": ""}
            yield from self._start(start if kind == "thinking" else {"type": "text", "text": ""})
        if text:
            yield self._delta({"type": f"{kind}_delta", kind: text})

    def whole(self, block: dict[str, Any]) -> Iterator[bytes]:
        """A block known whole: a tool_use's input as one input_json_delta."""
        if block["type"] != "tool_use":
            yield from self.piece(block["type"], block.get("text") or block.get("thinking", ""))
            return
        yield from self._start({**block, "input": {}})
        partial = orjson.dumps(block["input"]).decode()
        yield self._delta({"type": "input_json_delta", "partial_json": partial})

    def close(self) -> Iterator[bytes]:
        """The open block's end; an answer that had no block gets an empty text block."""
        if self.index == -1:
            yield from self._start({"type": "text", "text": ""})
        if self.open is not None:
            if self.open == "thinking":
                yield self._delta({"type": "signature_delta", "signature": ""})
            yield _event("content_block_stop", {"type": "content_block_stop", "index": self.index})
            self.open = None

    def _start(self, block: dict[str, Any]) -> Iterator[bytes]:
        yield from self.close() if self.index >= 0 else ()
        self.index += 1
        self.open = block["type"]
        start = {"type": "content_block_start", "index": self.index, "content_block": block}
        yield _event("content_block_start", start)
        if not self.pinged:
            self.pinged = True
            yield _event("ping", {"type": "ping"})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        body = {"type": "content_block_delta", "index": self.index, "delta": delta}
        return _event("content_block_delta", body)


async def _outcome(generation: AdmittedGeneration) -> tuple[DecodeResult, Cost]:
    """After its text ran out: the outcome, or the error that ended it (a server that
    stopped it: the reason it gave)."""
    outcome, cost = await generation.outcome()
    if outcome.finish_reason == "cancelled":
        raise generation.stream.cancel_reason or ShuttingDown(
            "the server is shutting down; the answer is incomplete"
        )
    return outcome, cost


def _ending(outcome: DecodeResult, called: bool) -> Ending:
    if called:
        return Ending("tool_use", None)
    if outcome.finish_reason == "length":
        return Ending("max_tokens", None)
    if outcome.stop_sequence is not None:
        return Ending("stop_sequence", outcome.stop_sequence)
    return Ending("end_turn", None)


async def _with_pings(deltas: AsyncIterator[str], every_s: float) -> AsyncIterator[str | None]:
    """`deltas`, and None each time `every_s` pass without one (a ping is due)."""
    iterator = aiter(deltas)
    pending: asyncio.Future[str] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=every_s)
            if not done:
                yield None
                continue
            finished, pending = pending, None
            try:
                yield finished.result()
            except StopAsyncIteration:
                return
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
