"""A generation's answer as the Responses API gives it: a Response object, or its stream
of events (`event: <type>` and `data: {...}` with a `sequence_number` from 0).

Output items are a reasoning model's thinking as a `reasoning` item first (its text as
one `reasoning_text` part, app.models.chat.reasoning), then a message with one `output_text`
part, or function calls read from the answer as chat reads them
(app.models.tools.read_calls; never from the thinking). Its text streams as it is
decoded; where calls may come (tools offered and not `none`), what may still be a call
is held (app.models.tools.CallWatch) and its items sent whole at the end.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from app.api.responses.schemas import ResponsesRequest
from app.api.responses.store import new_response_id
from app.api.thinking import frame_of
from app.core.overflow import said as truncation
from app.core.requests import ValidGenerationRequest
from app.core.work import AdmittedGeneration, Cost
from app.errors import ShuttingDown, VramgateError
from app.models.chat.reasoning import Frame, Piece, ThinkSplitter, split
from app.models.decoding import DecodeResult
from app.models.tools import CallWatch, ToolCall, read_calls

Item = dict[str, Any]
OnDone = Callable[[dict[str, Any]], Awaitable[None]]  # given the finished Response object


def message_item(text: str, status: str = "completed") -> Item:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [part],
    }


def reasoning_item(text: str, status: str = "completed") -> Item:
    part = {"type": "reasoning_text", "text": text}
    return {
        "id": f"rs_{uuid.uuid4().hex}",
        "type": "reasoning",
        "summary": [],
        "content": [part],
        "status": status,
    }


def call_item(call: ToolCall) -> Item:
    return {
        "id": f"fc_{uuid.uuid4().hex}",
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    }


def usage(outcome: DecodeResult) -> dict[str, Any]:
    return {
        "input_tokens": outcome.prompt_tokens,
        "input_tokens_details": {"cached_tokens": outcome.cached_tokens},
        "output_tokens": outcome.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
        **truncation(outcome),
    }


class ResponseDraft:
    """One answer in the making: its id, the request's settings it repeats, its items."""

    def __init__(self, body: ResponsesRequest, valid: ValidGenerationRequest) -> None:
        self.body = body
        self.valid = valid
        self.id = new_response_id()
        self.created_at = int(time.time())
        self.tier = "default"  # the tier it ran in, as OpenAI names it (once admitted)

    @property
    def calls_possible(self) -> bool:
        return self.valid.tool_mode != "none"

    def envelope(self, status: str, output: list[Item], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.body.model,  # the name asked for, as its client knows it
            "output": output,
            "error": None,
            "incomplete_details": None,
            "usage": None,
            "service_tier": self.tier,
            **self.body.echoed(),
            **extra,
        }

    def output(self, text: str, outcome: DecodeResult, frame: Frame | None = None) -> list[Item]:
        """The answer's items: its thinking, then its calls (after any text beside them),
        else a message."""
        thought, text = split(text, frame)
        first = [reasoning_item(thought)] if thought else []
        status = "incomplete" if outcome.finish_reason == "length" else "completed"
        if self.calls_possible:
            rest, calls = read_calls(text, set(self.valid.tool_names))
            calls = calls if self.valid.parallel_tool_calls else calls[:1]
            if calls:
                said = [message_item(rest)] if rest else []
                return [*first, *said, *(call_item(call) for call in calls)]
        return [*first, message_item(text, status)]

    def finished(self, output: list[Item], outcome: DecodeResult) -> dict[str, Any]:
        cut = outcome.finish_reason == "length"
        return self.envelope(
            "incomplete" if cut else "completed",
            output,
            usage=usage(outcome),
            incomplete_details={"reason": "max_output_tokens"} if cut else None,
            completed_at=None if cut else int(time.time()),
        )


async def outcome_of(generation: AdmittedGeneration) -> tuple[DecodeResult, Cost]:
    """After its deltas ran out: the outcome, or the error that ended it (a generation
    the server stopped, for an unload or a shutdown, is that error)."""
    outcome, cost = await generation.outcome()
    if outcome.finish_reason == "cancelled":
        raise generation.stream.cancel_reason or ShuttingDown(
            "the server is shutting down; the answer is incomplete"
        )
    return outcome, cost


async def whole(draft: ResponseDraft, generation: AdmittedGeneration) -> tuple[dict, Cost]:
    """The finished Response object and what it cost."""
    text = "".join([delta async for delta in generation.deltas()])
    outcome, cost = await outcome_of(generation)
    return draft.finished(draft.output(text, outcome, frame_of(generation)), outcome), cost


class EventWriter:
    """Server-sent events numbered from 0, in the order they are written."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def opening(emit: EventWriter, index: int, item: Item) -> list[bytes]:
    """An item's first events: it is added (empty, in progress), and its text part (a
    message's output_text, a reasoning item's reasoning_text)."""
    if item["type"] == "function_call":
        started = {**item, "arguments": "", "status": "in_progress"}
        return [emit("response.output_item.added", output_index=index, item=started)]
    part = {**item["content"][0], "text": ""}
    started = {**item, "status": "in_progress", "content": []}
    where = {"item_id": item["id"], "output_index": index}
    return [
        emit("response.output_item.added", output_index=index, item=started),
        emit("response.content_part.added", **where, content_index=0, part=part),
    ]


def delta(emit: EventWriter, index: int, item: Item, text: str) -> bytes:
    where = {"item_id": item["id"], "output_index": index}
    if item["type"] == "function_call":
        return emit("response.function_call_arguments.delta", **where, delta=text)
    if item["type"] == "reasoning":
        return emit("response.reasoning_text.delta", **where, content_index=0, delta=text)
    return emit("response.output_text.delta", **where, content_index=0, delta=text, logprobs=[])


def closing(emit: EventWriter, index: int, item: Item) -> list[bytes]:
    """An item's last events, with its whole text, then the item as it ends (each event
    is numbered as it is written: in this order)."""
    where = {"item_id": item["id"], "output_index": index}
    if item["type"] == "function_call":
        kind = "response.function_call_arguments.done"
        last = [emit(kind, **where, name=item["name"], arguments=item["arguments"])]
    elif item["type"] == "reasoning":
        part = item["content"][0]
        last = [
            emit("response.reasoning_text.done", **where, content_index=0, text=part["text"]),
            emit("response.content_part.done", **where, content_index=0, part=part),
        ]
    else:
        part = item["content"][0]
        kind = "response.output_text.done"
        last = [
            emit(kind, **where, content_index=0, text=part["text"], logprobs=[]),
            emit("response.content_part.done", **where, content_index=0, part=part),
        ]
    return [*last, emit("response.output_item.done", output_index=index, item=item)]


async def events(
    draft: ResponseDraft, generation: AdmittedGeneration, on_done: OnDone
) -> AsyncIterator[bytes]:
    """The answer's events; one that fails after the stream started ends in
    `response.failed`, its error in the response's `error`."""
    emit = EventWriter()
    try:
        started = draft.envelope("in_progress", [])
        yield emit("response.created", response=started)
        yield emit("response.in_progress", response=started)
        # where calls may come, text streams once it can be no call (CallWatch)
        names = set(draft.valid.tool_names)
        watch = CallWatch(names) if draft.calls_possible else None
        splitter, answer = ThinkSplitter(frame_of(generation)), StreamedAnswer(emit)
        async for piece in generation.deltas():
            for event in answer.pieces(splitter.push(piece), watch):
                yield event
        for event in answer.pieces(splitter.end(), watch):
            yield event
        outcome, _ = await outcome_of(generation)
        rest, calls = watch.end() if watch is not None else ("", [])
        calls = calls if draft.valid.parallel_tool_calls else calls[:1]
        for event in answer.thought_done():
            yield event
        output: list[Item] = answer.output[:]
        item, at = answer.message, len(output)
        if rest or answer.opened or not calls:  # the message: its text streamed, and the rest
            if not answer.opened:
                for event in opening(emit, at, item):
                    yield event
            if rest:
                answer.text += rest
                yield delta(emit, at, item, rest)
            status = "incomplete" if outcome.finish_reason == "length" else "completed"
            said = message_item(answer.text, status if not calls else "completed")
            output.append({**said, "id": item["id"]})
            for event in closing(emit, at, output[-1]):
                yield event
        for call in calls:
            called = call_item(call)
            for event in _whole_item(emit, len(output), called):
                yield event
            output.append(called)
        finished = draft.finished(output, outcome)
        await on_done(finished)
        kind = "response.completed" if finished["status"] == "completed" else "response.incomplete"
        yield emit(kind, response=finished)
    except VramgateError as exc:
        error = {"code": exc.code, "message": exc.message}
        yield emit("response.failed", response=draft.envelope("failed", [], error=error))
    finally:
        generation.close()


class StreamedAnswer:
    """The items a stream has written so far: its reasoning item while its thinking
    streams (closed when the answer's text begins), then its message's text."""

    def __init__(self, emit: EventWriter) -> None:
        self.emit = emit
        self.output: list[Item] = []  # the items written whole
        self.reasoning = reasoning_item("", "in_progress")
        self.thought = ""
        self.message = message_item("", "in_progress")
        self.text = ""
        self.opened = False  # the message has been added

    def pieces(self, pieces: list[Piece], watch: CallWatch | None) -> list[bytes]:
        """Events for pieces of the answer: thinking into the reasoning item, text into
        the message (through the watch for calls where they may come)."""
        events: list[bytes] = []
        for kind, piece in pieces:
            if kind == "thinking":
                if not self.thought:
                    events += opening(self.emit, 0, self.reasoning)
                self.thought += piece
                events.append(delta(self.emit, 0, self.reasoning, piece))
                continue
            text = watch.feed(piece) if watch is not None else piece
            if not text:
                continue
            events += self.thought_done()
            if not self.opened:
                self.opened = True
                events += opening(self.emit, len(self.output), self.message)
            self.text += text
            events.append(delta(self.emit, len(self.output), self.message, text))
        return events

    def thought_done(self) -> list[bytes]:
        """The reasoning item's last events, once (none where it did not think)."""
        if not self.thought or self.output:
            return []
        done = {**reasoning_item(self.thought), "id": self.reasoning["id"]}
        self.output.append(done)
        return closing(self.emit, 0, done)


def _whole_item(emit: EventWriter, index: int, item: Item) -> list[bytes]:
    text = item["arguments"] if item["type"] == "function_call" else item["content"][0]["text"]
    first = opening(emit, index, item)  # numbered as written: in this order
    middle = delta(emit, index, item, text)
    return [*first, middle, *closing(emit, index, item)]
