"""Structured output, the same for every engine: a JSON schema (an answer's
`response_format`, or a forced tool call's) compiled by llguidance into one grammar,
with no free whitespace between JSON tokens (a small model left to choose it can emit
newlines until `max_tokens`: SmolLM2 on llama.cpp's own whitespace-flexible grammar gave
377 of them for a recipe schema). A schema llguidance cannot enforce (a look-ahead
`pattern`, say) is a 400 naming the field it came in, before anything is queued, on
every engine. The torch engine compiles the grammar against its tokenizer; llama.cpp's
runner, whose builds carry llguidance, takes it as a `%llguidance` grammar.

An object schema that lists `properties` and says nothing of `additionalProperties` is
closed: no keys but the listed ones, as llama.cpp's own `json_schema_to_grammar` (and so
Ollama) compiles it and as OpenAI's strict schemas require. llguidance follows JSON
Schema's letter there (other keys allowed), and a small model given that freedom invents
keys until `max_tokens` (SmolLM2 on the recipe schema: `"unit_type_name"` over and over,
cut inside a string). A schema that writes `additionalProperties` keeps its own word."""

from __future__ import annotations

import functools
import json
from typing import Any

from app.errors import InvalidRequest

JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}  # llguidance's JsonCompileOptions


# the keywords whose values are schemas (one, a list, or a map of names to schemas): the
# walk that closes objects goes through these only, never into `properties` maps as if
# they were schemas (a property may be called "properties")
ONE_SCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")


def closed(schema: Any) -> Any:
    """`schema` with every object that lists `properties` and leaves
    `additionalProperties` unsaid closed to other keys (a new value; the caller's stays
    as it was)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in ONE_SCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    for key in SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(item) for item in out[key]]
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(item) for name, item in out[key].items()}
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def json_grammar(schema: str) -> str:
    """llguidance's grammar of a JSON schema (JSON text), compact, objects closed."""
    import llguidance

    compact = json.dumps(closed(json.loads(schema)))
    return str(llguidance.LLMatcher.grammar_from_json_schema(compact, JSON_OPTIONS))


MAX_SCHEMA_CHARS = 256 * 1024  # a schema's JSON text: generous for any real one (OpenAI's
# structured outputs stop at 5,000 properties and 120,000 characters of names and values);
# the grammar is compiled from it on every engine, cached, and echoed in stored responses


def refusal(schema: str, param: str) -> InvalidRequest | None:
    """Why `schema` cannot be enforced (a 400 naming `param`), or None: it can. Checked
    without a tokenizer: what llguidance refuses for any vocabulary, and its size."""
    if len(schema) > MAX_SCHEMA_CHARS:
        return InvalidRequest(
            f"{param}: this JSON schema is {len(schema):,} characters as JSON; at most "
            f"{MAX_SCHEMA_CHARS:,} are taken",
            param=param,
        )
    problem = _problem(schema)
    if problem is None:
        return None
    return InvalidRequest(f"{param}: this JSON schema cannot be enforced: {problem}", param=param)


@functools.lru_cache(maxsize=256)  # clients resend the same schema with every request
def _problem(schema: str) -> str | None:
    import llguidance

    try:
        problem = llguidance.LLMatcher.validate_grammar(json_grammar(schema))
    except (ValueError, TypeError) as exc:
        problem = str(exc)
    return problem if problem and not problem.startswith("WARNING") else None


def lark_grammar(schema: str) -> str:
    """The same grammar as llama.cpp's llguidance takes it in a request's `grammar`: its
    `%json` rule over the schema with the same options (what llama.cpp's own
    `json_schema_to_grammar` writes, less the free whitespace)."""
    compact = {**closed(json.loads(schema)), "x-guidance": JSON_OPTIONS}
    return "%llguidance {}\nstart: %json " + json.dumps(compact)
