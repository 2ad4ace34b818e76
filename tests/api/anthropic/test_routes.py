"""Anthropic's Messages API through the official `anthropic` client, unchanged, on live
servers: SmolLM2-135M-Instruct behind a `claude-*` alias (slow: a plain message, its
stream event by event, a forced tool call whose input validates and whose result
continues the chat, a stop sequence, count_tokens against usage); and the simulated model
behind a token (bad input answered in Anthropic's shape with nothing run or counted,
x-api-key and Bearer both accepted, a wrong key 401)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import orjson
import pytest
from anthropic import Anthropic

from app.config.settings import ModelSpec
from tests.support.live import Live, live_server, make_settings

MODEL = "claude-sonnet-4-5"  # an alias: the server answers with SmolLM2 (or sim)
GREEDY = {"temperature": 0}  # this SDK version has no temperature argument; the API has
WEATHER_ARGS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"name": "get_weather", "description": "Weather now", "input_schema": WEATHER_ARGS},
    {"name": "get_time", "description": "The time now", "input_schema": {"type": "object"}},
]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Oslo?"}]
EVENT_TYPES = {
    "message_start",
    "content_block_start",
    "ping",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
}


@pytest.fixture(scope="module")
def smol(smollm2, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Live, Anthropic]]:
    """SmolLM2 on the CPU, reached as any `claude-*` model; a client with any key."""
    model = ModelSpec(name="smollm2", kind="generation", path=smollm2)
    settings = make_settings(
        tmp_path_factory.mktemp("anthropic"),
        device="cpu",
        models=(model,),
        model_aliases={"claude-*": "smollm2"},
    )
    with live_server(settings) as live:
        yield live, Anthropic(base_url=live.url, api_key="anything", max_retries=0)


def raw_events(live: Live, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(event name, its data) of a streamed message, as they arrive on the wire."""
    events = []
    with httpx.stream("POST", live.url + "/v1/messages", json=body, timeout=120) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in answer.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                assert name is not None, "data without an event line"
                events.append((name, orjson.loads(line.removeprefix("data: "))))
                name = None
    return events


@pytest.mark.slow
def test_a_plain_message_answers_in_anthropics_shape_and_count_tokens_agrees(smol):
    _, client = smol
    ask = [{"role": "user", "content": "What is the capital of France? One word."}]
    system = "You are a terse geography teacher."
    message = client.messages.create(
        model=MODEL, max_tokens=16, system=system, messages=ask, extra_body=GREEDY
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == MODEL  # the name asked for
    assert message.content[0].type == "text" and message.content[0].text.strip()
    assert message.stop_reason in ("end_turn", "max_tokens")
    usage = message.usage
    assert usage.output_tokens > 0 and usage.cache_creation_input_tokens == 0
    counted = client.messages.count_tokens(model=MODEL, system=system, messages=ask)
    # Anthropic's input_tokens leave out the tokens read from the prefix cache
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert counted.input_tokens > 10


@pytest.mark.slow
def test_a_stream_sends_every_event_type_in_order_and_the_sdk_builds_the_message(smol):
    live, client = smol
    ask = [{"role": "user", "content": "Name three colours."}]
    body = {"model": MODEL, "max_tokens": 12, "messages": ask, "stream": True, **GREEDY}
    events = raw_events(live, body)
    names = [name for name, _ in events]
    assert set(names) == EVENT_TYPES
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["model"] == MODEL and start["usage"]["input_tokens"]
    text = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")
    ending = events[-2][1]
    assert ending["delta"]["stop_reason"] == "max_tokens" and ending["usage"]["output_tokens"] == 12

    with client.messages.stream(
        model=MODEL, max_tokens=12, messages=ask, extra_body=GREEDY
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == streamed == text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 12
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) > 0


def forced_call(client: Anthropic, stream: bool) -> Any:
    """A message whose answer must be a call to get_weather."""
    asked: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 200,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "extra_body": GREEDY,
    }
    if not stream:
        return client.messages.create(**asked)
    with client.messages.stream(**asked) as events:
        return events.get_final_message()


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_forced_tool_call_validates_and_its_result_continues_the_chat(smol, stream):
    _, client = smol
    message = forced_call(client, stream)
    assert message.stop_reason == "tool_use"
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER_ARGS)
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "12 degrees, light rain"}
    answer = client.messages.create(
        model=MODEL,
        max_tokens=40,
        messages=[
            *ASK,
            {"role": "assistant", "content": [block.model_dump() for block in message.content]},
            {"role": "user", "content": [result]},
        ],
        tools=TOOLS,
        extra_body=GREEDY,
    )
    assert answer.content[0].type == "text" and answer.content[0].text.strip(), answer
    assert answer.stop_reason in ("end_turn", "max_tokens")


@pytest.mark.slow
def test_a_stop_sequence_ends_the_answer_and_is_named(smol):
    _, client = smol
    ask = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    message = client.messages.create(
        model=MODEL, max_tokens=60, messages=ask, stop_sequences=["5"], extra_body=GREEDY
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "5", message
    assert "4" in message.content[0].text and "5" not in message.content[0].text


# -- bad input and the token, on the simulated model ----------------------------------------
SECRET = "s3cret-key"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    settings = make_settings(
        tmp_path_factory.mktemp("anthropic-guarded"),
        device="simulated:4GiB",
        models=(ModelSpec(name="sim", kind="simulated"),),
        model_aliases={"claude-*": "sim"},
        default_max_tokens=16,
        token=SECRET,
        cors_origins=("http://app.example",),
    )
    with live_server(settings) as live:
        yield live


def counters(live: Live) -> tuple[Any, ...]:
    status = httpx.get(live.url + "/status", headers={"x-api-key": SECRET}, timeout=30).json()
    served, rejected = status["counters"]["served"], status["counters"]["rejected"]
    return served, rejected, status["queue"]["depth"], status["pool"]["admitted_bytes"]


def test_x_api_key_and_bearer_are_accepted_and_a_wrong_key_is_401_in_anthropics_shape(guarded):
    ask: list[Any] = [{"role": "user", "content": "hello there"}]
    by_key = Anthropic(base_url=guarded.url, api_key=SECRET, max_retries=0)
    assert by_key.messages.create(model=MODEL, max_tokens=3, messages=ask).content[0].text
    by_bearer = Anthropic(base_url=guarded.url, auth_token=SECRET, max_retries=0)
    assert by_bearer.messages.count_tokens(model=MODEL, messages=ask).input_tokens == 2
    wrong = Anthropic(base_url=guarded.url, api_key=SECRET + "x", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        wrong.messages.create(model=MODEL, max_tokens=3, messages=ask)
    assert refused.value.status_code == 401
    body = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert body["error"]["code"] == "unauthorized" and SECRET not in refused.value.response.text


def test_anthropics_headers_and_beta_query_are_accepted_and_cors_allows_them(guarded):
    answer = httpx.post(
        guarded.url + "/v1/messages?beta=true",
        headers={
            "x-api-key": SECRET,
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "interleaved-thinking-2025-05-14,context-management-2025-06-27",
        },
        json={
            "model": MODEL,
            "max_tokens": 3,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "metadata": {"user_id": "someone"},
            "service_tier": "auto",
            "cache_control": {"type": "ephemeral"},
            "context_management": {"edits": []},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        },
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    preflight = httpx.options(
        guarded.url + "/v1/messages",
        headers={"Origin": "http://app.example", "Access-Control-Request-Method": "POST"},
    )
    allowed = preflight.headers["access-control-allow-headers"]
    assert {"x-api-key", "anthropic-version", "anthropic-beta"} <= set(allowed.split(", "))


BAD: list[tuple[str, dict[str, Any], str, str]] = [
    ("no max_tokens", {"max_tokens": None}, "max_tokens", "Field required"),
    (
        "an image",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
                        },
                        {"type": "text", "text": "What is this?"},
                    ],
                }
            ]
        },
        "messages.0.content.0",
        f"model '{MODEL}' cannot see images",
    ),
    (
        "a tool_choice naming no tool",
        {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "launch"}},
        "tool_choice",
        "'launch', which is not in tools",
    ),
    (
        "a server tool",
        {"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]},
        "tools",
        "runs on Anthropic's servers",
    ),
    ("an unknown field", {"frequency_penalty": 1}, "frequency_penalty", "not permitted"),
    ("a temperature over 1", {"temperature": 1.5}, "temperature", "less than or equal to 1"),
    (
        "a prefilled answer",
        {"messages": [*ASK, {"role": "assistant", "content": "The"}]},
        "messages.1",
        "prefilling",
    ),
]


@pytest.mark.parametrize(
    ("changes", "param", "said"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_bad_input_is_a_400_in_anthropics_shape_with_nothing_run(guarded, changes, param, said):
    body = {"model": MODEL, "max_tokens": 8, "messages": ASK, **changes}
    body = {key: value for key, value in body.items() if value is not None}
    before, refused = counters(guarded), 0
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        if path.endswith("count_tokens") and param in ("max_tokens", "temperature"):
            continue  # count_tokens needs no max_tokens; its temperature is never used
        answer = httpx.post(guarded.url + path, headers={"x-api-key": SECRET}, json=body)
        refused += 1
        assert answer.status_code == 400, answer.text
        error = answer.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        assert error["error"]["param"] == param and said in error["error"]["message"]
        assert error["error"]["code"] == "invalid_request"
    served, rejected, depth, admitted = counters(guarded)
    assert (served, depth, admitted) == (before[0], before[2], before[3])  # nothing ran
    invalid = before[1].get("invalid_request", 0)
    assert rejected == {**before[1], "invalid_request": invalid + refused}  # each counted


def test_an_unknown_model_is_a_404_not_found_error(guarded):
    client = Anthropic(base_url=guarded.url, api_key=SECRET, max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="gpt-4o", max_tokens=3, messages=ASK)
    assert missing.value.body["error"]["type"] == "not_found_error"
    assert missing.value.body["error"]["code"] == "model_not_found"


def test_a_paused_server_is_a_503_overloaded_error_with_retry_after(guarded):
    guarded.fleet.set_paused(True)
    try:
        answer = httpx.post(
            guarded.url + "/v1/messages",
            headers={"x-api-key": SECRET},
            json={"model": MODEL, "max_tokens": 3, "messages": ASK},
        )
    finally:
        guarded.fleet.set_paused(False)
    assert answer.status_code == 503 and int(answer.headers["retry-after"]) >= 1
    error = answer.json()["error"]
    assert error["type"] == "overloaded_error" and error["code"] == "paused"
