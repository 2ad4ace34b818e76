"""The answer's message as OpenAI shapes it, from a model's text: tool calls read out of
it, at most one where `parallel_tool_calls` is false."""

from __future__ import annotations

import json

from app.api.openai.replies import Reply
from app.core.requests import ValidGenerationRequest
from app.models.decoding import Chat, SamplingParams

TWO_CALLS = (
    'Checking both.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
)


def reply(**fields: object) -> Reply:
    asked: dict[str, object] = {
        "tool_mode": "auto",
        "tool_names": frozenset({"get_weather", "get_time"}),
        **fields,
    }
    chat = Chat([{"role": "user", "content": "hi"}])
    body = ValidGenerationRequest("tiny", chat, SamplingParams(), **asked)  # type: ignore[arg-type]
    return Reply(body, "chat.completion", "chatcmpl")


def test_calls_are_read_out_of_the_answer_and_the_text_left_is_the_content():
    message, finish = reply()._message(TWO_CALLS, "stop")
    assert finish == "tool_calls" and message["content"] == "Checking both."
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert [c["index"] for c in calls] == [0, 1]


def test_parallel_tool_calls_false_keeps_the_first_call_only():
    message, finish = reply(parallel_tool_calls=False)._message(TWO_CALLS, "stop")
    assert finish == "tool_calls"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]


def test_without_tools_the_text_is_the_content_even_if_it_looks_like_a_call():
    message, finish = reply(tool_mode="none")._message(TWO_CALLS, "length")
    assert message == {"role": "assistant", "content": TWO_CALLS} and finish == "length"
