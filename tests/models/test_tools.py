"""Tool calls in and out of the prompt: the messages a chat template gets, and the calls
read back from answers as models write them."""

from __future__ import annotations

import json

from app.models.tools import (
    CallWatch,
    call_schema,
    chat_messages,
    read_calls,
    template_knows_tools,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
NAMES = {"get_weather", "get_time"}


def test_a_hermes_block_is_a_call_and_the_text_around_it_stays():
    call = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    text = f"Let me look.\n<tool_call>\n{call}\n</tool_call>"
    rest, calls = read_calls(text, NAMES)
    assert rest == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]
    assert calls[0].id.startswith("call_")


def test_an_answer_that_is_only_a_call_or_a_list_of_calls_is_read_as_calls():
    one = '{"name": "get_time", "arguments": {}}'
    weather = '{"name": "get_weather", "parameters": {"city": "Rome"}}'
    many = f"```json\n[{one}, {weather}]\n```"
    assert [c.name for c in read_calls(one, NAMES)[1]] == ["get_time"]
    rest, calls = read_calls(many, NAMES)
    assert rest is None and [c.name for c in calls] == ["get_time", "get_weather"]
    assert json.loads(calls[1].arguments) == {"city": "Rome"}


def test_text_and_json_that_names_no_tool_are_left_as_text():
    for text in (
        "It is sunny in Oslo.",
        '{"name": "launch_rockets", "arguments": {}}',
        "{not json",
    ):
        assert read_calls(text, NAMES) == (text, [])


def test_a_template_without_tools_gets_them_in_the_system_message():
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "content": "12 C", "tool_call_id": "call_1"},
    ]  # fmt: skip
    shaped = chat_messages(messages, [WEATHER], knows_tools=False)
    assert shaped[0]["role"] == "system" and "get_weather" in shaped[0]["content"]
    assert json.loads(shaped[2]["content"]) == {
        "name": "get_weather",
        "arguments": {"city": "Oslo"},
    }
    assert shaped[3] == {"role": "tool", "content": "12 C", "tool_call_id": "call_1"}
    known = chat_messages(messages, [WEATHER], knows_tools=True)
    assert known[0]["role"] == "user"  # the template lists the tools itself
    assert known[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}


def test_a_forced_call_schema_names_the_function_and_its_arguments():
    time_tool = {"type": "function", "function": {"name": "get_time"}}
    named = call_schema([WEATHER, time_tool], "get_weather")
    assert named["properties"]["name"] == {"const": "get_weather"}
    assert named["properties"]["arguments"] == WEATHER["function"]["parameters"]
    either = call_schema([WEATHER, time_tool], None)
    assert len(either["anyOf"]) == 2
    # a function that declares no parameters is called with none: `{}`
    assert either["anyOf"][1]["properties"]["arguments"]["properties"] == {}


def test_templates_that_mention_tools_are_told_apart():
    assert template_knows_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
    assert not template_knows_tools(
        "{% for message in messages %}{{ message.content }}{% endfor %}"
    )
    assert not template_knows_tools(None)


def streamed(pieces: list[str], names: set[str]) -> tuple[list[str], str, list]:
    watch = CallWatch(names)
    out = [watch.feed(piece) for piece in pieces]
    rest, calls = watch.end()
    return out, rest, calls


def test_a_plain_answer_with_tools_offered_is_let_out_as_it_comes():
    out, rest, calls = streamed(["  ", "The", " weather", " is", " fine."], {"weather"})
    assert out == ["", "  The", " weather", " is", " fine."] and (rest, calls) == ("", [])


def test_an_answer_that_is_a_call_is_held_whole_and_read_at_the_end():
    pieces = ['{"na', 'me": "weather", ', '"arguments": {"city": "Oslo"}}']
    out, rest, calls = streamed(pieces, {"weather"})
    assert out == ["", "", ""] and rest == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("weather", {"city": "Oslo"})]


def test_json_that_is_no_call_comes_whole_at_the_end():
    out, rest, calls = streamed(['{"a"', ": 1}"], {"weather"})
    assert out == ["", ""] and (rest, calls) == ('{"a": 1}', [])


def test_a_call_after_some_words_holds_from_its_opener():
    pieces = [
        "Let me look.",
        " <tool",
        '_call>{"name": "weather", ',
        '"arguments": {}}</tool_call>',
    ]
    out, rest, calls = streamed(pieces, {"weather"})
    assert "".join(out) == "Let me look. " and out[0] == "Let me look."
    assert rest == "" and [c.name for c in calls] == ["weather"]


def test_an_opener_that_never_becomes_one_is_let_out():
    out, rest, calls = streamed(["<to", "day> is sunny"], {"weather"})
    assert out == ["", "<today> is sunny"] and (rest, calls) == ("", [])
    out, rest, calls = streamed(["It is <tool", "s> time"], {"weather"})
    assert "".join(out) + rest == "It is <tools> time" and calls == []


# DeepSeek-R1's own calls, as its template writes them (tests/support/templates) and
# llama.cpp's parser reads them (common/chat.cpp, common_chat_parse_deepseek_r1)
R1_CALLS = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
    '```json\n{"city": "Oslo"}\n```<｜tool▁call▁end｜>\n'
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>"
    "<｜tool▁calls▁end｜>"
)


def test_r1s_calls_block_is_its_calls_and_the_text_before_it_stays():
    rest, calls = read_calls(f"Let me look.\n{R1_CALLS}", NAMES)
    assert rest == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {}),
    ]
    cut_off = R1_CALLS.removesuffix("<｜tool▁calls▁end｜>")  # the answer ended at its last call
    assert [c.name for c in read_calls(cut_off, NAMES)[1]] == ["get_weather", "get_time"]


def test_an_r1_block_naming_no_tool_or_without_json_is_left_as_text():
    for text in (R1_CALLS.replace("get_time", "launch_rockets"), R1_CALLS.replace("{}", "{no")):
        assert read_calls(text, NAMES) == (text, [])


def test_an_r1_block_streamed_is_held_from_its_opener_and_read_at_the_end():
    text = f"Let me look.{R1_CALLS}"
    out, rest, calls = streamed([text[i : i + 3] for i in range(0, len(text), 3)], NAMES)
    assert "".join(out) == "Let me look." and rest == ""
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    out, rest, calls = streamed([R1_CALLS[:5], R1_CALLS[5:]], NAMES)  # a call at once
    assert out == ["", ""] and [c.name for c in calls] == ["get_weather", "get_time"]
