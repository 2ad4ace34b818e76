"""One structured decoding for every engine and API: SmolLM2-135M-Instruct served twice
by one server, on the torch engine (the converted safetensors) and on llama.cpp (its
GGUF in a runner), asked the same nested schemas and the same forced tool call through
the official Anthropic and OpenAI Responses clients (the OpenAI chat client's twins are
in tests/api/openai/test_structured.py and tests/engines/llama_cpp/test_generation.py).
Each answer parses, validates against its schema and ends by itself; a schema the
grammar cannot enforce is a 400 on both engines, beside its valid twin served."""

from __future__ import annotations

import json
import re

import anthropic
import jsonschema
import openai
import pytest
from openai import OpenAI

from app.config.settings import ModelSpec
from tests.support.schemas import NESTED, structured_schemas

pytestmark = pytest.mark.slow

ENGINES = ("torch", "llama.cpp")
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
LOOKAHEAD = {
    "type": "object",
    "properties": {"code": {"type": "string", "pattern": "(?=a)b"}},
    "required": ["code"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def live(smollm2, smollm2_gguf, tmp_path_factory):
    from tests.support.live import live_server, make_settings

    models = (
        ModelSpec(name="torch", kind="generation", path=smollm2, load="startup"),
        ModelSpec(
            name="llama.cpp",
            kind="generation",
            path=smollm2_gguf,
            context_length=2048,
            parallel=2,
            load="startup",
        ),
    )
    tmp = tmp_path_factory.mktemp("both-engines")
    settings = make_settings(tmp, device="cpu", models=models, queue_timeout=300)
    with live_server(settings) as server:
        yield server


def claude(live) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0)


def responses(live) -> OpenAI:
    return OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)


def compact(text: str) -> object:
    """The JSON in `text`, which must be written as the grammar writes it: no whitespace
    between its tokens, on either engine."""
    found = json.loads(text)
    assert text == json.dumps(found, separators=(",", ":"), ensure_ascii=False)
    return found


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", NESTED)
def test_a_nested_schema_through_the_anthropic_client(live, engine, name):
    case = structured_schemas()[name]
    message = claude(live).messages.create(
        model=engine,
        max_tokens=400,
        messages=[{"role": "user", "content": case["question"]}],
        output_config={"format": {"type": "json_schema", "schema": case["schema"]}},
        extra_body={"temperature": 0},  # this client's create() has no such parameter
    )
    assert message.stop_reason == "end_turn"
    (block,) = message.content
    assert block.type == "text"
    jsonschema.validate(compact(block.text), case["schema"])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", NESTED)
def test_a_nested_schema_through_the_responses_client(live, engine, name):
    case = structured_schemas()[name]
    answer = responses(live).responses.create(
        model=engine,
        input=case["question"],
        text={"format": {"type": "json_schema", "name": name, "schema": case["schema"]}},
        max_output_tokens=400,
        temperature=0,
    )
    assert answer.status == "completed"  # not "incomplete": it stopped by itself
    jsonschema.validate(compact(answer.output_text), case["schema"])


@pytest.mark.parametrize("engine", ENGINES)
def test_a_forced_function_call_through_the_responses_client(live, engine):
    called = responses(live).responses.create(
        model=engine,
        input="What is the weather in Oslo?",
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER}],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=120,
        temperature=0,
    )
    (call,) = called.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_forced_tool_use_through_the_anthropic_client(live, engine):
    message = claude(live).messages.create(
        model=engine,
        max_tokens=120,
        messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
        tools=[{"name": "get_weather", "description": "Weather now", "input_schema": WEATHER}],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body={"temperature": 0},
    )
    (block,) = [b for b in message.content if b.type == "tool_use"]
    assert block.name == "get_weather" and message.stop_reason == "tool_use"
    jsonschema.validate(block.input, WEATHER)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_lookahead_pattern_is_a_400_through_both_clients_and_its_twin_is_served(live, engine):
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude(live).messages.create(
            model=engine,
            max_tokens=40,
            messages=[{"role": "user", "content": "A code, please."}],
            output_config={"format": {"type": "json_schema", "schema": LOOKAHEAD}},
        )
    assert "look-around" in refused.value.message
    with pytest.raises(openai.BadRequestError) as refused_too:
        responses(live).responses.create(
            model=engine,
            input="A code, please.",
            text={"format": {"type": "json_schema", "name": "c", "schema": LOOKAHEAD}},
            max_output_tokens=40,
        )
    assert "look-around" in refused_too.value.message
    twin = json.loads(json.dumps(LOOKAHEAD))
    twin["properties"]["code"]["pattern"] = "^[a-z]{1,4}$"
    served = responses(live).responses.create(
        model=engine,
        input="A code, please.",
        text={"format": {"type": "json_schema", "name": "c", "schema": twin}},
        max_output_tokens=40,
        temperature=0,
    )
    assert re.fullmatch("[a-z]{1,4}", json.loads(served.output_text)["code"])
