"""Anthropic's Messages request (`POST /v1/messages`, `/v1/messages/count_tokens`) as
clients send it, bounded as app.api.openai.schemas' are, and its translation into the OpenAI
`ChatRequest` the rest of the server already validates, prices and decodes: assistant
`tool_use` blocks become `tool_calls`, `tool_result` blocks `role: tool` turns, tools
OpenAI function tools, `tool_choice` OpenAI's. Nothing here runs a model."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.api.errors import from_validation_errors
from app.api.openai.fields import NOT_YET, FieldSupport, screen_fields
from app.api.openai.schemas import (
    MAX_CHARS_HARD,
    MAX_MESSAGES,
    MAX_STOP,
    MAX_STOP_CHARS,
    MAX_TOKENS_HARD,
    MAX_TOOLS,
    ChatRequest,
)
from app.config.settings import MODEL_NAME_PATTERN
from app.errors import InvalidRequest

MAX_BLOCKS = 1024  # content blocks in one message
TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"
Ignored = Any  # a documented field that changes nothing here (see MESSAGES_FIELDS)
Text = Annotated[str, Field(max_length=MAX_CHARS_HARD)]


def _done(note: str = "") -> FieldSupport:
    return FieldSupport("implemented", note)


def _ignored(note: str) -> FieldSupport:
    return FieldSupport("ignored", note)


def _refused(note: str) -> FieldSupport:
    return FieldSupport("refused", note)


# Every top-level field Anthropic documents for /v1/messages, and what vramgate does with
# it; a field in no row is a 400 naming it (the request model forbids it).
MESSAGES_FIELDS: dict[str, FieldSupport] = {
    "model": _done("the served model, or a `model_aliases` pattern (`claude-*`)"),
    "messages": _done(
        "text, `tool_use`, `tool_result`, base64 images for a model that sees; thinking "
        "blocks to the template (it shows or drops them)"
    ),
    "max_tokens": _done("required (not for count_tokens); within the model's context"),
    "system": _done("a string or text blocks"),
    "stop_sequences": _done(f"up to {MAX_STOP} of up to {MAX_STOP_CHARS} characters"),
    "stream": _done("Anthropic's server-sent events"),
    "temperature": _done("0 to 1"),
    "top_p": _done(),
    "top_k": _done(),
    "tools": _done("custom tools; a forced call is decoded by grammar; no server tools"),
    "tool_choice": _done("`auto`, `any`, `tool`, `none`; `disable_parallel_tool_use`"),
    "thinking": _done(
        "a reasoning model's thinking as thinking blocks; `disabled` turns it off, "
        "`budget_tokens` ends it when spent (the answer follows)"
    ),
    "output_config": _done("`format`: JSON schema, by grammar; `effort`: gpt-oss's level"),
    "output_format": _done("the beta's name for `output_config.format`"),
    "metadata": _done("`user_id`: a caller's own; its prompts reuse only its own cached prefixes"),
    "service_tier": _ignored("one tier: this machine"),
    "cache_control": _ignored("the prefix cache needs no marks"),
    "context_management": _ignored("no server-side context editing: the prompt as sent"),
    "diagnostics": _ignored("no cache diagnostics"),
    "inference_geo": _ignored("this machine"),
    "speed": _ignored("one speed"),
    "user_profile_id": _ignored("no accounts here"),
    "workspace_id": _ignored("no accounts here"),
    "container": _refused("no code-execution containers here"),
    "mcp_servers": _refused(f"the MCP connector is {NOT_YET}; a client's own tools work"),
}


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cache_control: Ignored = None  # prompt caching marks: the prefix cache needs none


class TextBlock(_Block):
    type: Literal["text"]
    text: str = Field(max_length=MAX_CHARS_HARD)
    citations: Ignored = None


class ImageBlock(_Block):
    """An image for a model that sees: base64 (a `url` source is refused, as chat's;
    app.api.chat_images). In a tool result: refused."""

    type: Literal["image"]
    source: dict[str, Any]
    transformations: Ignored = None

    def as_openai(self, param: str) -> dict[str, Any]:
        """Chat's image part: a data URL, checked with chat's parts."""
        kind, source = self.source.get("type"), self.source
        if kind == "base64" and isinstance(source.get("data"), str):
            media = str(source.get("media_type") or "image")
            return {
                "type": "image_url",
                "image_url": {"url": f"data:{media};base64,{source['data']}"},
            }
        if kind == "url" and isinstance(source.get("url"), str):
            return {"type": "image_url", "image_url": {"url": source["url"]}}
        raise InvalidRequest(
            f"an image's source must be base64 data (got type {str(kind)[:32]!r})", param=param
        )


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str = Field(max_length=128)
    name: str = Field(max_length=64)
    input: dict[str, Any]
    caller: Ignored = None
    toolset_name: Ignored = None


ResultPart = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str = Field(max_length=128)
    content: Text | Annotated[list[ResultPart], Field(max_length=MAX_BLOCKS)] = ""
    is_error: bool = False
    toolset_name: Ignored = None

    def text(self) -> str:
        if isinstance(self.content, str):
            text = self.content
        else:
            text = "\n".join(block.text for block in self.content if isinstance(block, TextBlock))
        return f"Error: {text}" if self.is_error else text


class ThinkingBlock(_Block):
    """An earlier answer's thinking, sent back: to the template as `reasoning_content`
    (Qwen3's shows it within a turn of tool calls, drops it after the next question)."""

    type: Literal["thinking", "redacted_thinking"]
    thinking: str = Field(default="", max_length=MAX_CHARS_HARD)
    signature: str = Field(default="", max_length=MAX_CHARS_HARD)
    data: str = Field(default="", max_length=MAX_CHARS_HARD)


class OtherBlock(BaseModel):
    """Blocks Anthropic documents that need its servers or a model that reads files."""

    model_config = ConfigDict(extra="allow")
    type: Literal[
        "document",
        "search_result",
        "container_upload",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "tool_reference",
        "mcp_tool_use",
        "mcp_tool_result",
    ]


Block = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | OtherBlock,
    Field(discriminator="type"),
]


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: Text | Annotated[list[Block], Field(max_length=MAX_BLOCKS)]

    def blocks(self) -> list[Any]:
        if isinstance(self.content, str):
            return [TextBlock(type="text", text=self.content)]
        return list(self.content)


class AnthropicTool(BaseModel):
    """A custom tool; Anthropic's server tools (web search, code execution, its bash and
    editor...) run on Anthropic's servers and are refused, saying so."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["custom"] | None = None
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = Field(default=None, max_length=MAX_CHARS_HARD)
    input_schema: dict[str, Any]
    cache_control: Ignored = None
    strict: Ignored = None  # a forced call is always decoded to its schema
    input_examples: Ignored = None
    defer_loading: Ignored = None  # every tool is in the prompt
    allowed_callers: Ignored = None
    eager_input_streaming: Ignored = None

    @model_validator(mode="before")
    @classmethod
    def custom_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") not in (None, "custom"):
            raise InvalidRequest(
                f"tool {str(data.get('name'))[:64]!r} is an Anthropic server tool (type "
                f"{str(data['type'])[:64]!r}), which runs on Anthropic's servers; only "
                "custom tools (name, description, input_schema) are supported",
                param="tools",
            )
        return data

    def as_openai(self) -> dict[str, Any]:
        function = {"name": self.name, "parameters": self.input_schema}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


class AnthropicToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(default=None, max_length=64)
    disable_parallel_tool_use: bool = False

    def as_openai(self) -> str | dict[str, Any]:
        if self.type == "tool":
            if not self.name:
                raise InvalidRequest("tool_choice of type tool needs `name`", param="tool_choice")
            return {"type": "function", "function": {"name": self.name}}
        return {"auto": "auto", "any": "required", "none": "none"}[self.type]


class ThinkingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS_HARD)
    display: Literal["summarized", "omitted"] | None = None

    @property
    def shown(self) -> bool:
        """Whether thinking comes back as thinking blocks (where the model reasons)."""
        return self.type != "disabled"


class AnthropicOutputFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class AnthropicOutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    effort: str | None = Field(default=None, max_length=16)  # a template's level, if it has one
    format: AnthropicOutputFormat | None = None


_SAMPLING_AS_CHAT = {  # Anthropic's sampling fields, as chat's
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "stop_sequences": "stop",
}


class AnthropicMetadata(BaseModel):
    """`metadata`: Anthropic's only field of it, the end user's id (app.api.callers)."""

    model_config = ConfigDict(extra="forbid")
    user_id: str | None = Field(default=None, max_length=256)


class MessagesRequest(BaseModel):
    """Anthropic's `POST /v1/messages` body (MESSAGES_FIELDS: what each field does)."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(max_length=64, pattern=MODEL_NAME_PATTERN)
    messages: list[AnthropicMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int = Field(ge=1, le=MAX_TOKENS_HARD)
    system: Text | Annotated[list[TextBlock], Field(max_length=MAX_BLOCKS)] | None = None
    stop_sequences: list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]] | None = (
        Field(default=None, max_length=MAX_STOP)
    )
    stream: bool = False
    temperature: float = Field(default=1.0, ge=0.0, le=1.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, le=1_000_000)
    tools: list[AnthropicTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: AnthropicToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: AnthropicOutputConfig | None = None
    output_format: AnthropicOutputFormat | None = None
    metadata: AnthropicMetadata | None = None

    @model_validator(mode="before")
    @classmethod
    def screen_fields(cls, data: Any) -> Any:
        return screen_fields(MESSAGES_FIELDS, data)

    @property
    def thinking_shown(self) -> bool:
        return self.thinking is not None and self.thinking.shown

    def image_param(self) -> str | None:
        """Where the first image block is (`messages.i.content.j`), if any."""
        for i, message in enumerate(self.messages):
            for j, block in enumerate(message.blocks()):
                parts = block.content if isinstance(block, ToolResultBlock) else [block]
                if any(isinstance(part, ImageBlock) for part in parts):
                    return f"messages.{i}.content.{j}"
        return None

    def chat_request(self) -> ChatRequest:
        """The same request as OpenAI's chat request (a 400 for what it cannot say)."""
        if self.messages[-1].role == "assistant":
            raise InvalidRequest(
                "a last assistant turn (prefilling the answer) is not supported",
                param=f"messages.{len(self.messages) - 1}",
            )
        turns = self._system()
        for i, message in enumerate(self.messages):
            turns += _assistant(message, i) if message.role == "assistant" else _user(message, i)
        chat: dict[str, Any] = {
            "model": self.model,
            "messages": turns,
            "max_tokens": self.max_tokens,
            "stream": self.stream,
        }
        chat |= {  # only what the caller set: the model's defaults fill the rest
            chats: getattr(self, ours)
            for ours, chats in _SAMPLING_AS_CHAT.items()
            if ours in self.model_fields_set
        }
        if self.tools:
            chat["tools"] = [tool.as_openai() for tool in self.tools]
        if self.tool_choice is not None:
            chat["tool_choice"] = self.tool_choice.as_openai()
            chat["parallel_tool_calls"] = not self.tool_choice.disable_parallel_tool_use
        chat |= self._thinking()
        output = self.output_config.format if self.output_config else self.output_format
        if output is not None:
            schema = {"name": "output", "schema": output.json_schema}
            chat["response_format"] = {"type": "json_schema", "json_schema": schema}
        try:
            return ChatRequest.model_validate(chat)
        except ValidationError as exc:
            raise from_validation_errors(exc.errors()) from None

    def _thinking(self) -> dict[str, Any]:
        """`thinking` and `output_config.effort` as chat's reasoning fields: disabled is
        off, a budget is the thinking's budget, an effort is the template's level."""
        fields: dict[str, Any] = {}
        effort = self.output_config.effort if self.output_config else None
        if effort in ("low", "medium", "high", "max"):
            fields["reasoning_effort"] = "xhigh" if effort == "max" else effort
        if self.thinking is not None and self.thinking.type == "disabled":
            fields["reasoning_effort"] = "none"
        elif self.thinking is not None and self.thinking.budget_tokens is not None:
            fields["reasoning_budget_tokens"] = self.thinking.budget_tokens
        return fields

    def _system(self) -> list[dict[str, Any]]:
        if not self.system:
            return []
        if isinstance(self.system, str):
            return [{"role": "system", "content": self.system}]
        return [{"role": "system", "content": "\n\n".join(block.text for block in self.system)}]


class CountTokensRequest(MessagesRequest):
    """`POST /v1/messages/count_tokens`: the same body; `max_tokens` is not needed."""

    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_HARD)  # type: ignore[assignment]


def _user(message: AnthropicMessage, index: int) -> list[dict[str, Any]]:
    """A user turn: its tool results as `tool` turns, its text as a user turn, in order."""
    turns: list[dict[str, Any]] = []
    text: list[str] = []
    images: list[dict[str, Any]] = []
    for j, block in enumerate(message.blocks()):
        param = f"messages.{index}.content.{j}"
        if isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ImageBlock):
            images.append(block.as_openai(param))
        elif isinstance(block, ToolResultBlock):
            if text or images:
                turns.append(_user_turn(text, images))
                text, images = [], []
            if not isinstance(block.content, str) and any(
                isinstance(part, ImageBlock) for part in block.content
            ):
                raise InvalidRequest("images in a tool_result are not supported", param=param)
            turns.append(
                {"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()}
            )
        elif not isinstance(block, ThinkingBlock):
            raise _misplaced(block, "user", param)
    if text or images or not turns:
        turns.append(_user_turn(text, images))
    return turns


def _user_turn(text: list[str], images: list[dict[str, Any]]) -> dict[str, Any]:
    """A user turn of chat: its text, and its images as chat's image parts."""
    joined = "\n\n".join(text)
    if not images:
        return {"role": "user", "content": joined}
    return {"role": "user", "content": [*images, {"type": "text", "text": joined}]}


def _assistant(message: AnthropicMessage, index: int) -> list[dict[str, Any]]:
    """An assistant turn: its text, and its `tool_use` blocks as OpenAI tool calls."""
    text: list[str] = []
    thought: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(message.blocks()):
        if isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ThinkingBlock):
            thought.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            # as orjson writes it, but any integer (orjson refuses one past 64 bits: a 500)
            arguments = json.dumps(block.input, separators=(",", ":"), ensure_ascii=False)
            function = {"name": block.name, "arguments": arguments}
            calls.append({"id": block.id, "type": "function", "function": function})
        else:
            raise _misplaced(block, "assistant", f"messages.{index}.content.{j}")
    turn: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if any(thought):  # its template decides whether the model sees it again
        turn["reasoning_content"] = "".join(thought)
    if calls:
        turn["tool_calls"] = calls
    return [turn]


def _misplaced(block: Any, role: str, param: str) -> InvalidRequest:
    if isinstance(block, OtherBlock):
        return InvalidRequest(
            f"{block.type} blocks are not supported here (text, tool_use and tool_result are)",
            param=param,
        )
    return InvalidRequest(f"a {block.type} block cannot be in a {role} turn", param=param)
