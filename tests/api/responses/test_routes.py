"""OpenAI's Responses API on a live server, through the official `openai` client's
`responses.create` and `responses.stream`, with SmolLM2-135M-Instruct on the torch
engine asked for as "gpt-test" (a `model_aliases` name, echoed back): text, a forced
function call whose arguments validate and whose output continues the conversation
through `previous_response_id`, a JSON schema answer, stored answers retrieved and
deleted, streamed events in the documented order, and bad input refused with stable
codes before anything is queued or stored."""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI
from openai.types.responses import response_create_params

from app.api.responses.fields import RESPONSE_FIELDS
from app.api.responses.schemas import (
    ITEMS,
    FunctionCallItem,
    MessageItem,
    ReasoningItem,
    chat_messages,
    drop_oldest_turn,
)
from app.config.settings import ModelSpec
from tests.support.live import Live, live_server, make_settings

MODEL = "gpt-test"  # reaches smollm2 through model_aliases
WEATHER_ARGS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather now in a city",
    "parameters": WEATHER_ARGS,
}
FORCED = {"type": "function", "name": "get_weather"}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]
CALL_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
]


@pytest.fixture(scope="module")
def live(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    settings = make_settings(
        tmp_path_factory.mktemp("responses"),
        device="cpu",
        # a context of 2,048 (SmolLM2's own is 8,192): the truncation test prefills half
        # of it, which at 8,192 took two minutes of a 2-core CI machine
        models=(ModelSpec(name="smollm2", kind="generation", path=smollm2, context_length=2048),),
        model_aliases={"gpt-*": "smollm2"},
        health_interval=3600,  # no probe is served while a test counts what was
    )
    with live_server(settings) as server:
        yield server


@pytest.fixture(scope="module")
def client(live: Live) -> OpenAI:
    return OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)


def stored_files(live: Live) -> list[str]:
    folder = live.fleet.settings.resolved_data_dir / "responses"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def served(live: Live) -> int:
    return live.status()["counters"]["served_by_model"].get("smollm2", 0)


def context_of(live: Live) -> int:
    models = httpx.get(live.url + "/v1/models", timeout=30).json()["data"]
    return next(m["context_length"] for m in models if m["id"] == "smollm2")


# -- through the official client ----------------------------------------------------------
def test_a_text_answer_echoes_the_name_asked_for_and_counts_its_tokens(client):
    answer = client.responses.create(
        model=MODEL,
        instructions="You are terse.",
        input="Say hello.",
        max_output_tokens=24,
        temperature=0,
        metadata={"case": "text"},
    )
    assert answer.object == "response" and answer.id.startswith("resp_")
    assert answer.model == MODEL and answer.status in ("completed", "incomplete")
    assert answer.output[0].type == "message" and answer.output_text.strip()
    assert answer.metadata == {"case": "text"} and answer.instructions == "You are terse."
    usage = answer.usage
    assert usage.input_tokens > 5 and 0 < usage.output_tokens <= 24
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0
    assert usage.output_tokens_details.reasoning_tokens == 0


def test_a_forced_call_validates_and_its_output_continues_the_conversation(client):
    called = client.responses.create(
        model=MODEL,
        input="What is the weather in Oslo?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice=FORCED,  # type: ignore[arg-type]
        max_output_tokens=80,
        temperature=0,
    )
    (call,) = called.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.status == "completed" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER_ARGS)

    answer = client.responses.create(
        model=MODEL,
        previous_response_id=called.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "12 C, rain"}],
        tools=[WEATHER],  # type: ignore[list-item]
        max_output_tokens=30,
        temperature=0,
    )
    assert answer.previous_response_id == called.id and answer.output_text.strip()
    # the call and its output were in the prompt: more than the first question's tokens
    assert answer.usage.input_tokens > called.usage.input_tokens
    items = client.responses.input_items.list(answer.id, order="asc").data
    assert [item.type for item in items] == ["message", "function_call", "function_call_output"]


def test_a_json_schema_answer_validates(client):
    answer = client.responses.create(
        model=MODEL,
        input="Describe a person as JSON.",
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}},
        max_output_tokens=60,
        temperature=0,
    )
    assert answer.status == "completed"
    jsonschema.validate(json.loads(answer.output_text), PERSON)
    assert answer.text.format.type == "json_schema"


def test_a_stored_answer_is_retrieved_then_deleted(client, live):
    answer = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
    again = client.responses.retrieve(answer.id)
    assert again.model_dump() == answer.model_dump()
    client.responses.delete(answer.id)
    for ask in (client.responses.retrieve, client.responses.delete):
        with pytest.raises(openai.NotFoundError) as missing:
            ask(answer.id)
        assert missing.value.code == "response_not_found"
    unstored = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, store=False)
    assert f"{unstored.id}.json" not in stored_files(live)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def event_kinds(events: list[Any]) -> list[str]:
    """The events' types, runs of deltas as one, after checking their numbering."""
    assert [event.sequence_number for event in events] == list(range(len(events)))
    kinds = [event.type for event in events]
    return [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1] or "delta" not in k]


def test_streamed_text_arrives_as_the_documented_events(client):
    with client.responses.stream(
        model=MODEL, input="Say hello.", max_output_tokens=16, temperature=0
    ) as stream:
        events = list(stream)
    kinds = event_kinds(events)
    assert kinds[:-1] == TEXT_EVENTS
    assert kinds[-1] in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    final = events[-1].response
    assert deltas == done.text == final.output_text and deltas.strip()
    assert final.model == MODEL and final.usage.output_tokens > 0
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id


def test_a_streamed_forced_call_arrives_as_the_documented_events(client):
    with client.responses.stream(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice=FORCED,  # type: ignore[arg-type]
        max_output_tokens=80,
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert event_kinds(events) == CALL_EVENTS
    (call,) = final.output
    assert call.type == "function_call"
    jsonschema.validate(json.loads(call.arguments), WEATHER_ARGS)
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == call.arguments
    assert client.responses.retrieve(final.id).output[0].call_id == call.call_id


# -- refused before anything is queued or stored ----------------------------------------
def refused(live: Live, body: dict[str, Any], status: int, code: str) -> dict[str, Any]:
    """The error of a request that must change nothing: no stored answer, no request
    served by the model."""
    before = (stored_files(live), served(live))
    answer = httpx.post(live.url + "/v1/responses", json=body, timeout=120)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error"
    assert (stored_files(live), served(live)) == before
    return error


@pytest.mark.parametrize("tool", ["web_search", "file_search", "code_interpreter", "mcp"])
def test_a_hosted_tool_is_refused_saying_why(live, tool):
    body = {"model": MODEL, "input": "hi", "tools": [WEATHER, {"type": tool}]}
    error = refused(live, body, 400, "unsupported_tool")
    assert error["param"] == "tools[1]"
    assert tool in error["message"] and "not supported by a local server" in error["message"]


def test_an_unknown_previous_response_is_a_404(live):
    body = {"model": MODEL, "input": "hi", "previous_response_id": "resp_0123abc"}
    error = refused(live, body, 404, "previous_response_not_found")
    assert error["param"] == "previous_response_id"


@pytest.mark.parametrize("bad", ["../../etc/passwd", "resp_a/../b", "msg_123", "resp_" + "a" * 97])
def test_an_id_of_another_form_is_refused_before_it_names_a_file(live, bad):
    body = {"model": MODEL, "input": "hi", "previous_response_id": bad}
    assert refused(live, body, 400, "invalid_response_id")["param"] == "previous_response_id"
    answer = httpx.get(live.url + "/v1/responses/resp_x..y", timeout=30)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_response_id"


def test_an_image_to_a_model_that_cannot_see_is_a_400_naming_it(live):
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    content = [{"type": "input_text", "text": "What is this?"}, image]
    body = {"model": MODEL, "input": [{"role": "user", "content": content}]}
    error = refused(live, body, 400, "unsupported_model")
    assert MODEL in error["message"] and "images" in error["message"]


def test_a_prompt_over_the_context_is_a_400_naming_both_numbers(live):
    context = context_of(live)
    body = {"model": MODEL, "input": "word " * (context + 200)}
    error = refused(live, body, 400, "context_length_exceeded")
    assert str(context) in error["message"] and error["param"] == "input"
    prompt = int(error["message"].split("your messages resulted in ")[1].split()[0])
    assert prompt > context and error["prompt_tokens"] == prompt


@pytest.mark.slow
def test_with_truncation_auto_the_oldest_turns_go_until_it_fits(client, live):
    context = context_of(live)
    old = "word " * (context // 2 + 100)  # two of these are over the context
    turns = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": old},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": old},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "Say hello."},
    ]
    answer = client.responses.create(
        model=MODEL,
        input=turns,  # type: ignore[arg-type]
        truncation="auto",
        max_output_tokens=8,
    )
    # answered (SmolLM2 may end at once after so many words: no text is asked of it)
    assert answer.status in ("completed", "incomplete") and answer.truncation == "auto"
    assert answer.output[0].type == "message"
    assert context // 2 < answer.usage.input_tokens < context
    kept = client.responses.input_items.list(answer.id, order="asc").data
    assert [item.role for item in kept] == ["system", "user", "assistant", "user"]


# -- the request's fields, and its translation ---------------------------------------------
def test_every_field_the_openai_package_sends_is_classified():
    names = set(typing.get_type_hints(response_create_params.ResponseCreateParamsBase))
    names |= {"stream"}
    assert not names - set(RESPONSE_FIELDS)


def test_items_become_chat_turns_and_truncation_keeps_calls_with_their_outputs():
    items = ITEMS.validate_python(
        [
            {"role": "developer", "content": "Be terse."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
            {"role": "user", "content": "Thanks"},
        ]
    )
    messages = chat_messages(items)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assert messages[2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "rain"}
    shorter = drop_oldest_turn(items)  # the question, with the call and its output
    assert shorter is not None and [type(i) for i in shorter] == [MessageItem, MessageItem]
    assert shorter[1] is items[-1]
    unanswered = items[:4]  # the call is the last item: its turn has nothing after it
    assert [type(i) for i in drop_oldest_turn(unanswered) or []] == [
        MessageItem,
        ReasoningItem,
        FunctionCallItem,
    ]
    assert drop_oldest_turn(shorter) is None  # the system turn and the last one stay


def test_a_forced_call_and_a_json_format_together_are_a_400_naming_text(live):
    body = {
        "model": MODEL,
        "input": "hi",
        "tools": [WEATHER],
        "tool_choice": FORCED,
        "text": {"format": {"type": "json_object"}},
    }
    assert refused(live, body, 400, "invalid_request")["param"] == "text"


def sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """Each event's data, after checking its `event:` line names its type."""
    name = None
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = json.loads(line.removeprefix("data: "))
            assert data["type"] == name
            yield data


def test_a_stream_ended_by_the_server_ends_in_response_failed(live):
    """The model is unloaded under the stream: its last event says so; nothing stored."""
    body = {"model": MODEL, "input": "Tell a long story.", "max_output_tokens": 400}
    before = stored_files(live)
    with httpx.stream("POST", live.url + "/v1/responses", json={**body, "stream": True}) as answer:
        assert answer.status_code == 200
        events = []
        for event in sse_events(answer.iter_lines()):
            events.append(event)
            if event["type"] == "response.output_text.delta" and len(events) == 5:
                unload = live.url + "/admin/models/smollm2/unload?wait_s=0"
                assert httpx.post(unload, timeout=60).status_code == 200
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    last = events[-1]
    assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
    assert last["response"]["error"]["code"] and last["response"]["error"]["message"]
    assert stored_files(live) == before
