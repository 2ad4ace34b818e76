"""Every field of OpenAI's Responses API request, and what vramgate does with it: one
table (`RESPONSE_FIELDS`) saying each field is implemented, accepted and ignored, or
refused with a reason unless its value asks for nothing; and the hosted tools (web
search, code interpreter, MCP, ...), each refused saying why a local server has none.
A test walks the fields of the `openai` package's own request type against the table.
"""

from __future__ import annotations

from typing import Any

from app.api.openai.fields import CALLER_ID, FieldSupport
from app.errors import InvalidRequest, UnsupportedTool

_LOCAL = "it runs on OpenAI's servers, and a local server has "
_TRAINED = (
    "its calls are items of their own that OpenAI's models are trained to write; "
    "declare it as a function tool"
)
HOSTED_TOOLS: dict[str, str] = {
    "web_search": _LOCAL + "no search engine; declare a function tool that searches "
    '(Codex sends it unless run with -c web_search="disabled")',
    "web_search_preview": _LOCAL + "no search engine; declare a function tool that searches",
    "file_search": _LOCAL + "no vector stores; declare a function tool that searches files",
    "code_interpreter": _LOCAL + "no sandbox to run code in; declare a function tool",
    "computer_use_preview": _LOCAL + "no remote computer; declare function tools for actions",
    "computer_use": _LOCAL + "no remote computer; declare function tools for actions",
    "image_generation": _LOCAL + "no image model behind this route",
    "mcp": _LOCAL + "no MCP client; list the MCP server's tools as function tools",
    "local_shell": _TRAINED,
    "shell": _TRAINED,
    "apply_patch": _TRAINED,
    "custom": "free-form (grammar) tools are not implemented; declare a function tool",
    "namespace": "tool namespaces are not implemented; declare function tools (Codex "
    "sends one unless run with --disable multi_agent)",
    "tool_search": _LOCAL + "no tool registry; declare the function tools",
}


def _absent(value: Any) -> bool:
    return value is None or value is False or value == [] or value == {} or value == ""


def _done(note: str = "") -> FieldSupport:
    return FieldSupport("implemented", note)


def _ignored(note: str) -> FieldSupport:
    return FieldSupport("ignored", note)


def _refused(note: str) -> FieldSupport:
    return FieldSupport("refused", note, _absent)


# Every field of the `openai` package's ResponseCreateParams (a test walks them), and
# what Codex CLI sends beside them.
RESPONSE_FIELDS: dict[str, FieldSupport] = {
    "model": _done("a served model, or a name `model_aliases` maps to one; echoed as asked"),
    "input": _done("text, or messages, function_call / function_call_output, reasoning items"),
    "instructions": _done("a system turn first; not carried over by previous_response_id"),
    "tools": _done("function tools; hosted tools (web_search, mcp, ...) are a 400 saying why"),
    "tool_choice": _done("auto, none, required, or a named function (decoded by grammar)"),
    "parallel_tool_calls": _done("false: at most one call"),
    "text": _done("format text, json_object, json_schema (constrained decoding)"),
    "max_output_tokens": _done(),
    "temperature": _done(),
    "top_p": _done(),
    "store": _done(
        "kept in DATA_DIR/responses, up to max_stored_responses and max_stored_response_bytes"
    ),
    "previous_response_id": _done("its input and output come before this input"),
    "metadata": _done("up to 16 pairs; stored and echoed"),
    "truncation": _done("disabled: a prompt over the context is a 400; auto: oldest turns go"),
    "stream": _done("the documented event sequence"),
    "user": _done("echoed; " + CALLER_ID),
    "reasoning": _done(
        "`effort` switches a reasoning model (`none`: off); its thinking comes back as a "
        "`reasoning` item (`reasoning_text`), no summary"
    ),
    "include": _ignored("nothing extra to include: no encrypted reasoning, no sources"),
    "stream_options": _ignored("no obfuscation padding on loopback"),
    "prompt_cache_key": _done("echoed; " + CALLER_ID),
    "prompt_cache_options": _ignored("no routing between caches on one machine"),
    "prompt_cache_retention": _ignored("no routing between caches on one machine"),
    "safety_identifier": _done("echoed; " + CALLER_ID),
    "service_tier": _done("`flex`: background (waits for a person's work), `priority`: ahead"),
    "moderation": _ignored("no moderation here"),
    "max_tool_calls": _ignored("hosted tools only; none run here"),
    "context_management": _ignored("no server-side compaction"),
    "access_programs": _ignored("no accounts here"),
    "client_metadata": _ignored("Codex's turn and session ids: nothing to do with them"),
    "keep_alive": _done("vramgate extra (Ollama's): how long the model stays loaded idle"),
    "background": _refused("answers are synchronous or streamed, never queued in background"),
    "background_options": _refused("answers are never run in background"),
    "conversation": _refused("no conversation objects; use previous_response_id"),
    "prompt": _refused("stored prompt templates live on OpenAI's servers"),
    "image": _refused("no image generation behind this route"),
    "top_logprobs": _refused("not implemented yet"),
}


def screen(data: Any) -> tuple[Any, list[str]]:
    """The body without the ignored fields, and their names (for the log); a refused field
    that asks for something, or a hosted tool, is a 400 saying why."""
    if not isinstance(data, dict):
        return data, []
    kept, ignored = {}, []
    for name, value in data.items():
        field = RESPONSE_FIELDS.get(name)
        if field is None or field.support == "implemented":
            kept[name] = value  # unknown fields meet the schema's own 400
        elif field.support == "refused" and not field.asks_nothing(value):
            raise InvalidRequest(f"{name} is not supported: {field.note}", param=name)
        elif not field.asks_nothing(value):
            ignored.append(name)
    _refuse_hosted(kept.get("tools"), kept.get("tool_choice"))
    return kept, ignored


def _refuse_hosted(tools: Any, choice: Any) -> None:
    for index, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind != "function":
            reason = HOSTED_TOOLS.get(kind) or HOSTED_TOOLS.get(kind.rsplit("_20", 1)[0])
            reason = reason or "only function tools are supported by a local server"
            raise UnsupportedTool(
                f"tools[{index}]: the {kind!r} tool is not supported by a local server: {reason}",
                param=f"tools[{index}]",
            )
    if isinstance(choice, dict) and choice.get("type") not in (None, "function"):
        raise UnsupportedTool(
            f"tool_choice of type {choice.get('type')!r} is not supported by a local "
            "server: only `auto`, `none`, `required` and a named function are",
            param="tool_choice",
        )
