"""Objects a schema lists the properties of are closed to other keys, as llama.cpp's own
`json_schema_to_grammar` compiles them (`_build_object_rule` adds other keys only where
`additionalProperties` is given and not false): checked on the grammar itself, by what
llguidance's matcher accepts, with the schema's own word kept where it says one."""

from __future__ import annotations

import json

import llguidance

from app.models.structured import closed, json_grammar

RECIPE = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "items": {"type": "array", "items": {"type": "object", "properties": {"n": {}}}},
        "properties": {"type": "object", "properties": {"x": {"type": "integer"}}},
    },
    "required": ["name"],
}


def accepts(schema: dict, text: str) -> bool:
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_bytes_tokenizer()))
    matcher = llguidance.LLMatcher(tokenizer, json_grammar(json.dumps(schema)))
    ok = matcher.consume_tokens(tokenizer.tokenize_str(text))
    return bool(ok) and matcher.is_accepting() and not matcher.is_error()


def _bytes_tokenizer():
    class Bytes:  # one token a byte, and an end token: enough to match any text
        eos_token_id = 256
        bos_token_id = None
        tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]
        special_token_ids = (256,)

        def __call__(self, text):
            return list(text.encode() if isinstance(text, str) else text)

    return Bytes()


def test_listed_objects_are_closed_at_every_depth_and_a_property_named_properties_is_a_name():
    out = closed(RECIPE)
    assert out["additionalProperties"] is False
    assert out["properties"]["items"]["items"]["additionalProperties"] is False
    assert out["properties"]["properties"]["additionalProperties"] is False
    assert "additionalProperties" not in out["properties"]  # a map of names, not a schema
    assert "additionalProperties" not in RECIPE  # the caller's schema is left as it was


def test_a_schema_that_says_additional_properties_keeps_its_word():
    open_one = {**RECIPE, "additionalProperties": True}
    assert closed(open_one)["additionalProperties"] is True
    typed = {"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}}
    assert closed(typed)["additionalProperties"] == {"type": "integer"}


def test_the_grammar_refuses_an_unlisted_key_and_takes_the_listed_ones():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert accepts(schema, '{"a":1}')  # the positive control: the listed key
    assert not accepts(schema, '{"a":1,"b":2}')
    assert accepts({**schema, "additionalProperties": True}, '{"a":1,"b":2}')
