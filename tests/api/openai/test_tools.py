"""Tool calls through the official `openai` client on a live server: a forced call is
decoded under its arguments' schema (on a small random Llama, whose free text is noise,
so valid arguments are the grammar's doing; and on SmolLM2-135M, slow), streamed and
not; a tool's result continues the chat."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from openai import OpenAI

WEATHER_ARGS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather now",
            "parameters": WEATHER_ARGS,
        },
    },
    {"type": "function", "function": {"name": "get_time", "description": "The time now"}},
]
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


def forced_call(client: OpenAI, model: str, stream: bool) -> tuple[str, dict, str]:
    """(function name, arguments, finish reason) of a call forced to get_weather."""
    asked = {
        "model": model,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 200,
        "temperature": 0,
    }
    if not stream:
        choice = client.chat.completions.create(**asked).choices[0]  # type: ignore[call-overload]
        call = choice.message.tool_calls[0]
        assert choice.message.content is None and call.id.startswith("call_")
        return call.function.name, json.loads(call.function.arguments), choice.finish_reason
    name, arguments, finish = "", "", ""
    for chunk in client.chat.completions.create(**asked, stream=True):  # type: ignore[call-overload]
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                name += call.function.name or ""
                arguments += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return name, json.loads(arguments), finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_forced_call_has_arguments_valid_against_the_tools_schema(tiny_llm, stream):
    name, arguments, finish = forced_call(tiny_llm, "tiny", stream)
    assert name == "get_weather" and finish == "tool_calls"
    jsonschema.validate(arguments, WEATHER_ARGS)


def test_required_calls_one_of_the_tools(tiny_llm):
    choice = tiny_llm.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=200,  # type: ignore[arg-type]
    ).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name in {"get_weather", "get_time"}


def test_a_tool_result_continues_the_chat(tiny_llm):
    arguments = '{"city": "Oslo", "unit": "celsius"}'
    function = {"name": "get_weather", "arguments": arguments}
    call = {"id": "call_1", "type": "function", "function": function}
    answer = tiny_llm.chat.completions.create(
        model="tiny",
        messages=[
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "12 degrees, light rain"},
        ],  # type: ignore[list-item]
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=8,
    )
    assert answer.choices[0].message.content and answer.usage.prompt_tokens > 20


def test_a_named_tool_that_is_not_offered_is_a_400(tiny_llm):
    with pytest.raises(openai.BadRequestError) as refused:
        tiny_llm.chat.completions.create(
            model="tiny",
            messages=ASK,
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice={"type": "function", "function": {"name": "launch"}},
        )
    assert refused.value.param == "tool_choice"


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_smollm2_forced_call_is_valid_and_its_result_continues_the_chat(small_llm, stream):
    name, arguments, finish = forced_call(small_llm, "smollm2", stream)
    assert name == "get_weather" and finish == "tool_calls"
    jsonschema.validate(arguments, WEATHER_ARGS)
    function = {"name": name, "arguments": json.dumps(arguments)}
    call = {"id": "call_1", "type": "function", "function": function}
    answer = small_llm.chat.completions.create(
        model="smollm2",
        messages=[
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "12 degrees, light rain"},
        ],  # type: ignore[list-item]
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=40,
        temperature=0,
    )
    assert answer.choices[0].message.content, answer


POEM = [{"role": "user", "content": "Write two short sentences about the sea."}]


@pytest.mark.slow
def test_smollm2_streams_a_plain_answer_while_tools_are_offered(small_llm):
    """Open WebUI offers its tools with every chat: an answer that is no call streams as
    it is decoded, in many chunks before the last (it came whole at the end before), and
    is the same text as the answer asked for whole. Each asks as a caller of its own
    (`user`), so neither decodes over the other's cached prompt. (In CI the two texts
    once parted 40 tokens in; whether from the cached prefix's other matrix shapes or
    from float sums that change with the machine's load, as a prefix-cache test's
    first, uncached turn once did here under load, is not known.)"""
    asked = {"model": "smollm2", "messages": POEM, "tools": TOOLS, "max_tokens": 40}
    whole = small_llm.chat.completions.create(**asked, temperature=0, user="whole")  # type: ignore[call-overload]
    assert not whole.choices[0].message.tool_calls  # the premise: a plain answer
    pieces, finish = [], None
    streamed = small_llm.chat.completions.create(**asked, temperature=0, stream=True, user="stream")  # type: ignore[call-overload]
    for chunk in streamed:
        for choice in chunk.choices:
            if choice.delta.content:
                assert finish is None  # text before the end, not a burst with it
                pieces.append(choice.delta.content)
            finish = choice.finish_reason or finish
    assert len(pieces) >= 10, pieces
    assert "".join(pieces) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
