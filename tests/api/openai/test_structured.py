"""Structured outputs over real HTTP with the official client: `response_format` JSON
modes enforced by constrained decoding. Fast tests use a small random Llama (whose free
text is noise, so any valid JSON is the grammar's doing); the slow one SmolLM2-135M."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest
from openai import OpenAI

BOUNDED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "colour"],
    "additionalProperties": False,
}


def ask(client: OpenAI, response_format: dict, **extra: object) -> str:
    answer = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Describe someone."}],
        max_tokens=120,
        response_format=response_format,  # type: ignore[arg-type]
        **extra,  # type: ignore[arg-type]
    )
    assert answer.choices[0].finish_reason == "stop", answer.choices[0].message.content
    return answer.choices[0].message.content or ""


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_random_model_answers_json_valid_against_the_schema(tiny_llm, temperature):
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": BOUNDED}}
    for seed in range(3):
        text = ask(tiny_llm, schema, temperature=temperature, seed=seed)
        jsonschema.validate(json.loads(text), BOUNDED)


def test_json_object_mode_gives_an_object(tiny_llm):
    free = (
        tiny_llm.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=30, temperature=0
        )
        .choices[0]
        .message.content
    )
    with pytest.raises(ValueError):  # unconstrained, the random model's text is no JSON
        json.loads(free or "")
    text = ask(tiny_llm, {"type": "json_object"}, temperature=0)
    assert isinstance(json.loads(text), dict)


def test_a_streamed_answer_is_constrained_too(tiny_llm):
    stream = tiny_llm.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Describe someone."}],
        max_tokens=120,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": BOUNDED}},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), BOUNDED)


def test_a_schema_the_engine_cannot_enforce_is_a_400_before_anything_runs(tiny_llm):
    bad = {"type": "object", "properties": {"x": {"type": "strnig"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        ask(tiny_llm, {"type": "json_schema", "json_schema": {"name": "bad", "schema": bad}})
    assert refused.value.param == "response_format"
    assert "cannot be enforced" in refused.value.message


# Twenty schemas as applications write them (structured_schemas.json): nested objects,
# arrays, enums, bounded numbers, required and optional fields. Strings and arrays are
# bounded, as a schema for a small model should be: the grammar guarantees the shape, so a
# bounded schema bounds the answer's length (and `max_tokens` is set above it).
SCHEMAS = json.loads((Path(__file__).parent / "structured_schemas.json").read_text())


@pytest.mark.slow
def test_smollm2_answers_twenty_schemas_with_json_that_validates(small_llm):
    assert len(SCHEMAS) == 20
    for case in SCHEMAS:
        name, schema = case["name"], case["schema"]
        answer = small_llm.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": case["question"] + " Answer in JSON."}],
            max_tokens=600,
            temperature=0,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": True},
            },
        )
        text = answer.choices[0].message.content or ""
        assert answer.choices[0].finish_reason == "stop", (name, text)
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.slow
def test_smollm2_fills_pydantic_models_through_the_clients_parse(small_llm):
    from pydantic import BaseModel, Field

    class Author(BaseModel):
        name: str = Field(max_length=24)
        born: int = Field(ge=1000, le=2025)

    class Book(BaseModel):
        title: str = Field(max_length=24)
        pages: int = Field(ge=1, le=2000)
        author: Author
        genres: list[str] = Field(max_length=3)

    for question in ("Describe a famous novel.", "Describe a cookbook."):
        parsed = small_llm.chat.completions.parse(
            model="smollm2",
            messages=[{"role": "user", "content": question}],
            max_tokens=600,
            temperature=0,
            response_format=Book,
        )
        book = parsed.choices[0].message.parsed
        assert isinstance(book, Book) and isinstance(book.author, Author), parsed
