"""Answers in Anthropic's shapes: an answer's blocks (thinking, text, tool_use) and stop
reason, thinking left out where the request did not ask for it, and a stream's events —
a failure after it began as an `error` event, the generation closed either way. (How
`<think>` text is split out however the stream cuts it: tests/models/test_reasoning.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from app.api.anthropic.replies import Ending, MessageReply
from app.core.requests import ValidGenerationRequest
from app.errors import RunTimeout
from app.models.chat.reasoning import Frame
from app.models.decoding import DecodeResult, GenerationInput, SamplingParams

THINKS = Frame()  # a model that thinks in `<think>` tags, its prompt leaving the block to it


def valid(**fields: Any) -> ValidGenerationRequest:
    return ValidGenerationRequest("sim", "prompt", SamplingParams(), **fields)


def outcome(finish: str = "stop", stop: str | None = None, cached: int = 0) -> DecodeResult:
    return DecodeResult("", 30, 7, finish, 8, cached_tokens=cached, stop_sequence=stop)


def test_an_answers_blocks_are_thinking_text_and_tool_uses_and_its_stop_reason_says_why():
    reply = MessageReply(valid(tool_mode="auto", tool_names=frozenset({"w"})), "claude-x", True)
    text = '<think>Call it.</think>{"name": "w", "arguments": {"city": "Oslo"}}'
    content, ending = reply.blocks(text, outcome(), Frame())
    assert [block["type"] for block in content] == ["thinking", "tool_use"]
    assert content[1]["input"] == {"city": "Oslo"} and content[1]["id"].startswith("toolu_")
    assert ending.stop_reason == "tool_use"
    plain = MessageReply(valid(), "claude-x", False)
    assert plain.blocks("", outcome("length"), None)[0] == [{"type": "text", "text": ""}]
    assert plain.blocks("a", outcome("length"), None)[1].stop_reason == "max_tokens"
    assert plain.blocks("a", outcome("stop", "\n\n"), None)[1] == Ending("stop_sequence", "\n\n")
    assert plain.blocks("a", outcome("stop"), None)[1] == Ending("end_turn", None)
    # a reasoning model's thinking, not asked for: left out (its text alone is the answer)
    unasked = plain.blocks("<think>Hm.</think>\n\nYes.", outcome(), Frame())[0]
    assert unasked == [{"type": "text", "text": "Yes."}]


class FakeGeneration:
    """What a reply reads of an admitted generation; its outcome is given."""

    def __init__(
        self, deltas: list[str], result: DecodeResult | Exception, frame: Frame | None = THINKS
    ) -> None:
        self._deltas, self._result, self.closed = deltas, result, False
        payload = GenerationInput([1] * 30, SamplingParams(), 16, thinking=frame)
        prepared = type("Prepared", (), {"tokens": 30, "payload": payload})()
        self.job = type("Job", (), {"prepared": prepared})()
        self.stream = type("Stream", (), {"cancel_reason": None})()

    async def deltas(self) -> AsyncIterator[str]:
        for delta in self._deltas:
            yield delta

    async def outcome(self) -> tuple[DecodeResult, Any]:
        if isinstance(self._result, Exception):
            raise self._result
        return self._result, None

    def close(self) -> None:
        self.closed = True


def events(reply: MessageReply, generation: FakeGeneration) -> list[tuple[str, dict[str, Any]]]:
    async def read() -> list[bytes]:
        return [chunk async for chunk in reply._events(generation)]  # type: ignore[arg-type]

    found = []
    for chunk in asyncio.run(read()):
        name, data = chunk.decode().strip().split("\n")
        found.append((name.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
    return found


def test_a_stream_sends_thinking_then_text_blocks_and_the_usage_without_cached_tokens():
    generation = FakeGeneration(["<think>hm", "m</think>", "Yes."], outcome(cached=20))
    sent = events(MessageReply(valid(stream=True), "claude-x", True), generation)
    names = [name for name, _ in sent]
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",  # the thinking block's (empty) signature
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert sent[1][1]["content_block"]["type"] == "thinking" and sent[7][1]["index"] == 1
    assert [data["delta"].get("thinking") for _, data in sent[3:5]] == ["hm", "m"]
    assert sent[5][1]["delta"]["type"] == "signature_delta"
    assert sent[8][1]["delta"] == {"type": "text_delta", "text": "Yes."}
    usage = sent[-2][1]["usage"]
    assert usage["input_tokens"] == 10 and usage["cache_read_input_tokens"] == 20
    assert generation.closed


def test_a_failure_after_the_stream_began_is_an_error_event_and_the_generation_closes():
    failed = RunTimeout("no progress for 60 s", retry_after=5)
    generation = FakeGeneration(["Partial"], failed)
    sent = events(MessageReply(valid(stream=True), "claude-x", False), generation)
    assert [name for name, _ in sent][:2] == ["message_start", "content_block_start"]
    name, error = sent[-1]
    assert name == "error" and error["type"] == "error"
    assert error["error"]["type"] == "timeout_error" and error["error"]["code"] == "run_timeout"
    assert generation.closed


def test_a_stream_with_tools_streams_thinking_and_text_and_holds_a_call_to_the_end():
    """Tools offered and thinking asked for (Claude Code on a reasoning model): thinking
    streams as its block, the text as it comes, and a call after the thinking arrives
    whole as a tool_use, as the whole answer's `blocks` give it."""
    tools = valid(stream=True, tool_mode="auto", tool_names=frozenset({"w"}))
    pieces = [
        "<th",
        "ink>Call",
        " it.</think>\n",
        '{"name": "w", ',
        '"arguments": {"city": "Oslo"}}',
    ]
    sent = events(MessageReply(tools, "claude-x", True), FakeGeneration(pieces, outcome()))
    starts = [data["content_block"] for name, data in sent if name == "content_block_start"]
    assert [block["type"] for block in starts] == ["thinking", "tool_use"]
    thought = [d["delta"]["thinking"] for n, d in sent if d.get("delta", {}).get("thinking")]
    assert "".join(thought) == "Call it." and len(thought) == 2  # streamed, not held
    (json_delta,) = [d["delta"] for n, d in sent if d.get("delta", {}).get("partial_json")]
    assert orjson.loads(json_delta["partial_json"]) == {"city": "Oslo"}
    assert sent[-2][1]["delta"]["stop_reason"] == "tool_use"
    said = events(
        MessageReply(tools, "claude-x", True),
        FakeGeneration(["<think>No.</think>", "It is", " sunny."], outcome()),
    )
    text = [d["delta"]["text"] for n, d in said if d.get("delta", {}).get("type") == "text_delta"]
    assert text == ["It is", " sunny."]  # text streams while tools are offered
