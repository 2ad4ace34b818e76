"""Every field of the `openai` package's request types, sent by the official client to a
live server (a small random Llama and the embedded all-MiniLM-L6-v2 on the CPU): each is
implemented, accepted and ignored, or refused exactly as app/api/openai/fields.py (and so the
docs/api-openai.md's table) says. The field names are read from the installed package, so a field
OpenAI adds fails here until it is classified."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI
from openai.types import completion_create_params as completions_params
from openai.types import embedding_create_params as embeddings_params
from openai.types.chat import completion_create_params as chat_params

from app.api.openai.fields import FIELDS, markdown_table
from app.config.settings import ModelSpec
from tests.support.random_models import save_random_llama

ROOT = Path(__file__).resolve().parents[3]

# A value for each field that asks for something (refused fields must say no to it).
SAMPLES: dict[str, Any] = {
    "audio": {"voice": "alloy", "format": "wav"},
    "best_of": 2,
    "dimensions": 384,
    "echo": True,
    "encoding_format": "base64",
    "frequency_penalty": 0.5,
    "function_call": "auto",
    "functions": [{"name": "f", "parameters": {"type": "object"}}],
    "logit_bias": {"5": 3},
    "logprobs": True,
    "max_completion_tokens": 2,
    "max_tokens": 2,
    "metadata": {"project": "x"},
    "modalities": ["text", "audio"],
    "moderation": {"model": "omni-moderation-latest"},
    "n": 2,
    "parallel_tool_calls": False,
    "prediction": {"type": "content", "content": "hello"},
    "presence_penalty": 0.5,
    "prompt_cache_key": "k",
    "prompt_cache_options": {"mode": "explicit", "ttl": "30m"},
    "prompt_cache_retention": "24h",
    "reasoning_effort": "low",
    "response_format": {"type": "json_object"},
    "safety_identifier": "someone",
    "seed": 3,
    "service_tier": "auto",
    "stop": ["\n\n"],
    "store": True,
    "stream_options": {"include_usage": True},
    "suffix": "and so on",
    "temperature": 0.5,
    "tool_choice": "auto",
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "top_logprobs": 2,
    "top_p": 0.9,
    "user": "someone",
    "verbosity": "low",
    "web_search_options": {},
}
# Fields that mean something only beside another (as in OpenAI's API).
COMPANIONS: dict[str, dict[str, Any]] = {"top_logprobs": {"logprobs": True}}
# Given by every call below, or the reason the call exists.
BASE = {"model", "messages", "prompt", "input", "stream"}


def fields_of(typed_dict: Any) -> set[str]:
    return set(typed_dict.__required_keys__ | typed_dict.__optional_keys__)


ROUTE_TYPES = {
    "chat": fields_of(chat_params.CompletionCreateParamsStreaming),
    "completions": fields_of(completions_params.CompletionCreateParamsStreaming),
    "embeddings": fields_of(embeddings_params.EmbeddingCreateParams),
}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from tests.support.live import live_server, make_settings

    folder = save_random_llama(tmp_path_factory.mktemp("tiny-llama"), context=1024)
    models = (
        ModelSpec(name="tiny", kind="generation", path=folder),
        ModelSpec(name="all-MiniLM-L6-v2", kind="embedding"),
    )
    settings = make_settings(tmp_path_factory.mktemp("fields"), device="cpu", models=models)
    with live_server(settings) as live:
        yield OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)


def call(client: OpenAI, route: str, **fields: Any) -> Any:
    if route == "chat":
        fields = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2} | fields
        return client.chat.completions.create(model="tiny", **fields)
    if route == "completions":
        return client.completions.create(model="tiny", prompt="hi", **{"max_tokens": 2} | fields)
    return client.embeddings.create(model="all-MiniLM-L6-v2", input="hi", **fields)


def test_every_field_of_the_openai_request_types_is_classified():
    for route, names in ROUTE_TYPES.items():
        missing = names - set(FIELDS[route])
        assert not missing, f"{route}: fields the openai package sends that nobody classified"
        assert names - BASE <= set(SAMPLES), f"{route}: add a sample value to SAMPLES"


@pytest.mark.parametrize("route", list(ROUTE_TYPES))
def test_each_field_is_implemented_ignored_or_refused_as_the_table_says(client, route):
    for name in sorted(ROUTE_TYPES[route] - BASE):
        support = FIELDS[route][name]
        if support.support == "refused":
            with pytest.raises(openai.BadRequestError) as refused:
                call(client, route, **{name: SAMPLES[name]})
            assert refused.value.param == name, name
            assert refused.value.code == "invalid_request", name
            assert support.note in refused.value.message, name
        else:  # implemented or ignored: the request is served
            answer = call(client, route, **{name: SAMPLES[name]}, **COMPANIONS.get(name, {}))
            assert answer.model in {"tiny", "all-MiniLM-L6-v2"}, name


def test_refused_fields_that_ask_for_nothing_are_served(client):
    asks_nothing = {"audio": None, "modalities": ["text"], "web_search_options": None}
    for name, value in asks_nothing.items():
        assert FIELDS["chat"][name].support == "refused"
        assert call(client, "chat", **{name: value}).choices[0].message.content is not None
    served = call(client, "completions", best_of=1, suffix=None)
    assert served.choices[0].text is not None


def test_a_field_nobody_defines_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as refused:
        call(client, "chat", extra_body={"temprature": 0.5})
    assert refused.value.param == "temprature"


def test_the_documented_table_is_the_one_the_code_enforces():
    assert markdown_table() in (ROOT / "docs" / "api-openai.md").read_text()
