"""Structured output, the same for every engine: a JSON schema (an answer's
`response_format`, or a forced tool call's) compiled by llguidance into one grammar,
with no free whitespace between JSON tokens (a small model left to choose it can emit
newlines until `max_tokens`: SmolLM2 on llama.cpp's own whitespace-flexible grammar gave
377 of them for a recipe schema). A schema llguidance cannot enforce (a look-ahead
`pattern`, say) is a 400 naming the field it came in, before anything is queued, on
every engine. The torch engine compiles the grammar against its tokenizer; llama.cpp's
runner, whose builds carry llguidance, takes it as a `%llguidance` grammar."""

from __future__ import annotations

import functools
import json
from typing import Any

from app.errors import InvalidRequest

JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}  # llguidance's JsonCompileOptions


def json_grammar(schema: str) -> str:
    """llguidance's grammar of a JSON schema (JSON text), compact."""
    import llguidance

    return str(llguidance.LLMatcher.grammar_from_json_schema(schema, JSON_OPTIONS))


def refusal(schema: str, param: str) -> InvalidRequest | None:
    """Why `schema` cannot be enforced (a 400 naming `param`), or None: it can. Checked
    without a tokenizer: what llguidance refuses for any vocabulary."""
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
    compact = {**json.loads(schema), "x-guidance": JSON_OPTIONS}
    return "%llguidance {}\nstart: %json " + json.dumps(compact)
