"""Anthropic's request translated into chat's: every field the `anthropic` package sends
is classified (a field Anthropic adds fails here until it is), tool_use and tool_result
blocks become OpenAI's tool calls and tool turns, and what cannot be said is a 400."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import message_count_tokens_params, message_create_params

from app.api.anthropic.schemas import MESSAGES_FIELDS, CountTokensRequest, MessagesRequest
from app.api.openai.schemas import NamedToolChoice
from app.errors import InvalidRequest

# The API's sampling fields, which this version of the package leaves to `extra_body`.
SAMPLING = {"temperature", "top_p", "top_k", "stream"}


def request(**fields: Any) -> MessagesRequest:
    body = {"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    return MessagesRequest.model_validate({**body, **fields})


def test_every_field_of_the_anthropic_package_is_classified():
    create = set(message_create_params.MessageCreateParamsBase.__annotations__)
    count = set(message_count_tokens_params.MessageCountTokensParams.__annotations__)
    assert create | count | SAMPLING <= set(MESSAGES_FIELDS)
    implemented = {name for name, f in MESSAGES_FIELDS.items() if f.support == "implemented"}
    assert implemented <= set(MessagesRequest.model_fields)


def test_a_tool_conversation_becomes_chats_calls_and_tool_turns():
    chat = request(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": "Weather in Oslo and Bergen?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "two calls", "signature": "x"},
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Oslo"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "w", "input": {"city": "Bergen"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "down"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
        tools=[{"name": "w", "input_schema": {"type": "object"}, "cache_control": {"type": "x"}}],
        tool_choice={"type": "tool", "name": "w", "disable_parallel_tool_use": True},
    ).chat_request()
    turns = [m.as_dict() for m in chat.messages]
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert turns[0]["content"] == "Be brief." and turns[2]["content"] == "Looking."
    calls = turns[2]["tool_calls"]
    assert [c["id"] for c in calls] == ["toolu_1", "toolu_2"]
    assert calls[1]["function"] == {"name": "w", "arguments": '{"city":"Bergen"}'}
    assert turns[3] == {"role": "tool", "content": "rain", "tool_call_id": "toolu_1"}
    assert turns[4]["content"] == "Error: down" and turns[5]["content"] == "And tomorrow?"
    assert isinstance(chat.tool_choice, NamedToolChoice) and chat.parallel_tool_calls is False
    assert chat.tool_mode() == "forced" and chat.tools and chat.tools[0].function.name == "w"


@pytest.mark.parametrize(
    ("choice", "openai"), [("auto", "auto"), ("any", "required"), ("none", "none")]
)
def test_tool_choice_types_map_to_openais(choice, openai):
    tools = [{"name": "w", "input_schema": {"type": "object"}}]
    assert request(tools=tools, tool_choice={"type": choice}).chat_request().tool_choice == openai


def test_output_config_format_is_a_json_schema_response_format():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = request(output_config={"format": {"type": "json_schema", "schema": schema}})
    assert chat.chat_request().response_format.json_schema.json_schema == schema  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "Anthropic server tool"),
        ({"tool_choice": {"type": "tool"}}, "needs `name`"),
        ({"container": "c1"}, "no code-execution containers"),
        ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "MCP connector"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "document blocks are not supported",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_use", "id": "t", "name": "w", "input": {}}],
                    }
                ]
            },
            "cannot be in a user turn",
        ),
    ],
)
def test_what_cannot_be_said_is_refused_saying_why(fields, said):
    with pytest.raises(InvalidRequest, match=said):
        request(**fields).chat_request()


def test_count_tokens_needs_no_max_tokens_and_ignored_fields_are_dropped():
    body = {"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}
    counted = CountTokensRequest.model_validate({**body, "metadata": {"user_id": "u"}})
    assert counted.max_tokens is None and counted.chat_request().max_tokens is None


def test_a_tool_calls_input_with_an_integer_past_64_bits_translates():
    """A client's tool_use input holding 2**70 (schemathesis sent one: orjson refused it,
    a 500): its arguments are that JSON, compact as orjson writes the others."""
    chat = request(
        messages=[
            {"role": "user", "content": "Count."},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {"n": 2**70}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
        ],
    ).chat_request()
    (call,) = chat.messages[1].as_dict()["tool_calls"]
    assert call["function"]["arguments"] == '{"n":1180591620717411303424}'
