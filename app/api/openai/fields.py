"""Every field of OpenAI's request bodies, and what vramgate does with it.

One table per route: a field is implemented (the request schemas in app.api.openai.schemas
declare and use it), accepted and ignored (it has no meaning on one local machine), or
refused with a reason unless its value asks for nothing (`n: 1`, `logprobs: false`). A
field in no table is a 400 naming it, as OpenAI answers. docs/api-openai.md's table is
rendered from here (`markdown_table`), and a test walks the fields of the `openai` package's own
request types against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from app.errors import InvalidRequest

Support = Literal["implemented", "ignored", "refused"]
Route = Literal["chat", "completions", "embeddings"]


def _absent(value: Any) -> bool:
    return value is None or value is False or value == [] or value == {} or value == ""


@dataclass(frozen=True)
class FieldSupport:
    support: Support
    note: str = ""
    asks_nothing: Callable[[Any], bool] = _absent  # refused: values that ask for nothing


def _done(note: str = "") -> FieldSupport:
    return FieldSupport("implemented", note)


AUTOMATIC_CACHE = "the prefix cache is automatic: a prompt that begins like a kept one reuses it"
# the ids that, with the address and the credential, scope the prefix cache (app.api.callers)
CALLER_ID = "a caller's own: its prompts reuse only its own cached prefixes"


def _ignored(note: str) -> FieldSupport:
    return FieldSupport("ignored", note)


def _refused(note: str, asks_nothing: Callable[[Any], bool] = _absent) -> FieldSupport:
    return FieldSupport("refused", note, asks_nothing)


NOT_YET = "not implemented yet"
# the request's class in the queue (app.sched.priority)
TIER_NOTE = "`flex`: background (waits for a person's work), `priority`: ahead of it; echoed"
PRIORITY_NOTE = "vLLM's: below 0 ahead of interactive work, above 0 background"
_SHARED: dict[str, FieldSupport] = {
    "model": _done(),
    "frequency_penalty": _done("-2 to 2, on the tokens generated so far"),
    "presence_penalty": _done("-2 to 2, on the tokens generated so far"),
    "logit_bias": _done("token id (the model's tokenizer) → -100 to 100"),
    "max_tokens": _done(),
    "n": _done("up to 16; each choice a stream, priced and admitted as one"),
    "seed": _done("each seeded request samples from its own generator"),
    "stop": _done("up to 4 strings"),
    "stream": _done(),
    "stream_options": _done("`include_usage`"),
    "temperature": _done(),
    "top_p": _done(),
    "user": _done(CALLER_ID),
    # extras from vLLM and llama.cpp
    "top_k": _done("vLLM / llama.cpp extra; 0 or -1: off"),
    "min_p": _done("vLLM / llama.cpp extra"),
    "repetition_penalty": _done("vLLM extra (llama.cpp: repeat_penalty); prompt and output"),
    "keep_alive": _done("Ollama's: how long the model stays loaded idle (5m, 0, -1)"),
    "priority": _done(PRIORITY_NOTE),
}

FIELDS: dict[Route, dict[str, FieldSupport]] = {
    "chat": {
        **_SHARED,
        "messages": _done(
            "text and `image_url` (data URL) parts for a model that sees, assistant "
            "`tool_calls` and `reasoning_content` (to its template), `role: tool` answers"
        ),
        "max_completion_tokens": _done("`max_tokens` wins where both are set"),
        "audio": _refused("no audio output", lambda v: v is None),
        "function_call": _refused("deprecated by OpenAI; use `tools` (not implemented yet)"),
        "functions": _refused("deprecated by OpenAI; use `tools` (not implemented yet)"),
        "logprobs": _done("the model's own distribution; streamed: on a choice's last chunk"),
        "top_logprobs": _done("0 to 20"),
        "metadata": _ignored("nothing is stored"),
        "modalities": _refused("text only", lambda v: v is None or v == ["text"]),
        "moderation": _ignored("no moderation here"),
        "parallel_tool_calls": _done("false: at most one call (a forced answer is one call)"),
        "prediction": _ignored("a latency hint; the answer is the same without it"),
        "prompt_cache_key": _done(CALLER_ID),
        "prompt_cache_options": _ignored(AUTOMATIC_CACHE),
        "prompt_cache_retention": _ignored(AUTOMATIC_CACHE),
        "reasoning_effort": _done(
            "a reasoning model's switch: `none` turns thinking off (Qwen3's `enable_thinking`, "
            "or the block its prompt opened closed), `low`/`medium`/`high` reach a template "
            "that reads a level (gpt-oss's); `<think>` thinking comes back in `reasoning_content`"
        ),
        "reasoning_budget_tokens": _done(
            "llama.cpp extra: the most tokens it thinks; then the thinking is closed and "
            "the answer follows (counted in `max_tokens`)"
        ),
        "response_format": _done("`text`, `json_object`, `json_schema`: constrained decoding"),
        "safety_identifier": _done(CALLER_ID),
        "service_tier": _done(TIER_NOTE),
        "store": _ignored("nothing is stored"),
        "tool_choice": _done("`required` or a named function: the call is decoded by grammar"),
        "tools": _done("functions; through the chat template, or the system message"),
        "verbosity": _ignored("no verbosity setting"),
        "web_search_options": _refused("no web search here", lambda v: v is None),
    },
    "completions": {
        **_SHARED,
        "prompt": _done("one prompt per request"),
        "best_of": _refused(NOT_YET, lambda v: v is None or v == 1),
        "echo": _done("not with `logprobs` (the prompt's are not computed)"),
        "logprobs": _done("0 to 5 alternatives; streamed: on a choice's last chunk"),
        "suffix": _refused("insertion (fill in the middle) is not supported"),
    },
    "embeddings": {
        "input": _done("strings, or token ids of the model's own tokenizer"),
        "model": _done(),
        "dimensions": _done("the model's width, or a Matryoshka width it declares (cut)"),
        "encoding_format": _done("`float` or `base64`"),
        "user": _ignored("no accounts here"),
        "keep_alive": _SHARED["keep_alive"],
        "priority": _SHARED["priority"],
        "service_tier": _done(TIER_NOTE),
    },
}


def screen(route: Route, data: Any) -> Any:
    """A request body with the ignored fields (and refused ones that ask for nothing)
    taken out; a refused field that asks for something is a 400 naming it."""
    return screen_fields(FIELDS[route], data)


def screen_fields(table: dict[str, FieldSupport], data: Any) -> Any:
    """`screen` with a route's own table (Anthropic's, in app.api.anthropic.schemas)."""
    if not isinstance(data, dict):
        return data
    kept = {}
    for name, value in data.items():
        field = table.get(name)
        if field is None or field.support == "implemented":
            kept[name] = value  # unknown fields meet the schema's own 400
        elif field.support == "refused" and not field.asks_nothing(value):
            raise InvalidRequest(f"{name} is not supported: {field.note}", param=name)
    return kept


def markdown_table() -> str:
    """docs/api-openai.md's table: every field of every route, its support, and why."""
    lines = ["| route | field | support | note |", "|---|---|---|---|"]
    paths = {
        "chat": "/v1/chat/completions",
        "completions": "/v1/completions",
        "embeddings": "/v1/embeddings",
    }
    for route, table in FIELDS.items():
        for name, field in sorted(table.items()):
            lines.append(f"| `{paths[route]}` | `{name}` | {field.support} | {field.note} |")
    return "\n".join(lines)
