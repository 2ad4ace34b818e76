"""Tool (function) calls: putting the tools into the prompt, and reading calls back out.

A model whose chat template knows tools (it mentions `tools`: Qwen, Llama 3.1+, Mistral,
Hermes-style templates) gets them through the template, as transformers passes them. A
template that does not (SmolLM2's) gets them in the system message, with the instruction
to answer a call as a JSON object `{"name": ..., "arguments": {...}}`; earlier calls in
the conversation are shown to it in that same form.

A forced call (`tool_choice` "required" or a named function) is decoded under a grammar
(`call_schema`), so its arguments always parse and validate. Otherwise the answer is
searched for calls in the forms models write: Hermes' `<tool_call>{...}</tool_call>`
blocks, DeepSeek-R1's `<｜tool▁calls▁begin｜>` block (its calls as llama.cpp's parser reads
them: common/chat.cpp, `common_chat_parse_deepseek_r1`), or an answer that is nothing but
such a JSON object (or a list of them).
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

INSTRUCTION = (
    "You can call these functions (each with a JSON schema of its arguments):\n{tools}\n"
    'To call one, answer with nothing but a JSON object: {{"name": <the function\'s '
    'name>, "arguments": <its arguments>}}.'
)
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
R1_OPENER, R1_CLOSER = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_R1_BLOCK = re.compile(rf"{R1_OPENER}(.*?)(?:{R1_CLOSER}|$)", re.DOTALL)
# one call: `function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>`
_R1_CALL = re.compile(
    r"(?:<｜tool▁call▁begin｜>)?function<｜tool▁sep｜>([^\n]+)\n```json\n(.*?)```\s*<｜tool▁call▁end｜>",
    re.DOTALL,
)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str

    def as_openai(self) -> dict[str, Any]:
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


def template_knows_tools(template: str | None) -> bool:
    return bool(template) and "tools" in str(template)


def chat_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, knows_tools: bool
) -> list[dict[str, Any]]:
    """The messages as the chat template takes them: tool calls' arguments as objects
    where the template knows tools, otherwise as our instruction's JSON, and the tools in
    the system message."""
    shaped = []
    for message in messages:
        message = dict(message)
        calls = message.pop("tool_calls", None) or []
        if calls and knows_tools:
            message["tool_calls"] = [_with_object_arguments(call) for call in calls]
        elif calls:
            shown = [_instruction_form(call) for call in calls]
            message["content"] = json.dumps(shown[0] if len(shown) == 1 else shown)
        if message.get("content") is None:
            message["content"] = ""
        shaped.append(message)
    if tools and not knows_tools:
        listing = json.dumps([tool["function"] for tool in tools], indent=1)
        text = INSTRUCTION.format(tools=listing)
        if shaped and shaped[0]["role"] in ("system", "developer"):
            shaped[0] = {**shaped[0], "content": shaped[0]["content"] + "\n\n" + text}
        else:
            shaped.insert(0, {"role": "system", "content": text})
    return shaped


def call_schema(tools: list[dict[str, Any]], name: str | None) -> dict[str, Any]:
    """The JSON schema of one call to `name` (None: to any of `tools`)."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool["function"]["name"]},
                "arguments": tool["function"].get("parameters") or NO_ARGUMENTS,
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
        if name is None or tool["function"]["name"] == name
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def read_calls(text: str, names: set[str]) -> tuple[str | None, list[ToolCall]]:
    """(the text left over, or None; the calls) from a model's answer."""
    r1 = _r1_calls(text, names)
    if r1 is not None:
        return r1
    blocks = _BLOCK.findall(text)
    if blocks:
        calls = [call for block in blocks for call in _calls_in(block, names)]
        if calls:
            rest = _BLOCK.sub("", text).strip()
            return rest or None, calls
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    calls = _calls_in(fenced.group(1) if fenced else stripped, names)
    return (None, calls) if calls else (text, [])


def _r1_calls(text: str, names: set[str]) -> tuple[str | None, list[ToolCall]] | None:
    """DeepSeek-R1's calls block, where the answer has one whose every call names a tool
    and has JSON arguments (None: it has no such block)."""
    blocks = _R1_BLOCK.findall(text)
    found = [call for block in blocks for call in _R1_CALL.findall(block)]
    calls = [
        _calls_in(json.dumps({"name": name, "arguments": _json(args)}), names)
        for name, args in found
    ]
    if not found or not all(calls):
        return None
    rest = _R1_BLOCK.sub("", text).strip()
    return rest or None, [call for each in calls for call in each]


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # no call: `_calls_in` refuses arguments that are no JSON


def _calls_in(text: str, names: set[str]) -> list[ToolCall]:
    try:
        value = json.loads(text)
    except ValueError:
        return []
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in names:
            return []
        arguments = item.get("arguments", item.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return []
        calls.append(ToolCall(item["name"], json.dumps(arguments), f"call_{uuid.uuid4().hex[:24]}"))
    return calls


def _with_object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    with contextlib.suppress(ValueError):  # else the template shows the text as it came
        function["arguments"] = json.loads(function.get("arguments") or "{}")
    return {**call, "function": function}


def _instruction_form(call: dict[str, Any]) -> dict[str, Any]:
    function = _with_object_arguments(call)["function"]
    return {"name": function.get("name"), "arguments": function.get("arguments")}


OPENERS = ("<tool_call>", R1_OPENER)  # where a call begins after some text
_CALL_STARTS = ("{", "[", "`")  # an answer that is a call (or a list, or fenced) begins so


class CallWatch:
    """An answer streamed while tools are offered: its text is let out as soon as it can
    no longer be the start of a tool call, and what may be one is held to the end.

    Undecided while only blank; an answer whose first other character opens JSON (or a
    fence) may be nothing but a call, and is held whole; one that begins as an opener
    (Hermes' `<tool_call>`, R1's `<｜tool▁calls▁begin｜>`) is held until it is one or
    diverges. Text let out is watched for an opener later on (a call after some words):
    from the opener on, it is held again. `end` reads the calls in what was held; text
    there that is no call is the rest of the content."""

    def __init__(self, names: set[str]) -> None:
        self._names = names
        self._held = ""
        self._streaming = False  # decided: this answer is text, let out as it comes

    def feed(self, text: str) -> str:
        """What of `text` (and what was held before it) may be streamed now."""
        self._held += text
        if not self._streaming:
            start = self._held.lstrip()
            if not start:
                return ""
            if start.startswith(_CALL_STARTS) or start.startswith(OPENERS):
                return ""  # may be nothing but a call: held to the end
            if any(opener.startswith(start) for opener in OPENERS):
                return ""  # an opener's first characters so far
            self._streaming = True
        return self._let_out()

    def _let_out(self) -> str:
        """The held text up to an opener (held from there on), or up to a tail that may
        still become one."""
        found = [at for at in (self._held.find(opener) for opener in OPENERS) if at >= 0]
        if found:
            at = min(found)
            out, self._held = self._held[:at], self._held[at:]
            self._streaming = False  # a call after some text: the rest is held
            return out
        keep = max(partial_tail(self._held, opener) for opener in OPENERS)
        cut = len(self._held) - keep
        out, self._held = self._held[:cut], self._held[cut:]
        return out

    def end(self) -> tuple[str, list[ToolCall]]:
        """The text still to send as content, and the calls the answer made."""
        held, self._held = self._held, ""
        if self._streaming:  # the tail that might have opened a call did not
            return held, []
        rest, calls = read_calls(held, self._names)
        if not calls:
            return held, []
        return rest or "", calls


def partial_tail(text: str, marker: str) -> int:
    """How many of `text`'s last characters are the start of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
