"""OpenAI's Responses API request (POST /v1/responses), and its translation into the chat
request the rest of the server validates, prices and runs (app.api.openai.schemas.ChatRequest):
input items become chat turns (a `function_call` an assistant turn's `tool_calls`, a
`function_call_output` a `tool` turn), function tools and `tool_choice` become chat's,
`text.format` becomes `response_format`, so forced calls and JSON schemas go through the
same constrained decoding as chat's.

Every field of OpenAI's request is implemented, accepted and ignored, or refused with a
reason, and hosted tools are refused saying why (app.api.responses.fields). Input items
ignore keys they do not use (`id`, `status`, `annotations`...): clients send back the
output items they were given, as they were given them.
"""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from app.api.callers import MAX_CALLER_ID
from app.api.errors import from_validation_errors
from app.api.openai.schemas import (
    MAX_CHARS_HARD,
    MAX_MESSAGES,
    MAX_TOKENS_HARD,
    MAX_TOOLS,
    ChatRequest,
    KeepAlive,
)
from app.api.responses.fields import screen
from app.config.settings import MODEL_NAME_PATTERN
from app.errors import InvalidRequest
from app.models.chat.reasoning import OpenAIEffort

MAX_ITEMS = 2048
MAX_PARTS = 256
MAX_ID_CHARS = 128
MAX_METADATA = 16  # OpenAI's bounds: 16 pairs, keys of 64 and values of 512 characters
FUNCTION_NAME = r"^[A-Za-z0-9_.-]{1,64}$"


# -- input items ------------------------------------------------------------------------
class _Lenient(BaseModel):
    """An item or a part as a client sends it back: keys it does not use are dropped."""

    model_config = ConfigDict(extra="ignore")


Text = Annotated[str, Field(max_length=MAX_CHARS_HARD)]
ItemId = Annotated[str | None, Field(max_length=MAX_ID_CHARS)]


class InputText(_Lenient):
    type: Literal["input_text"]
    text: Text


class OutputText(_Lenient):
    type: Literal["output_text"]
    text: Text


class Refusal(_Lenient):
    type: Literal["refusal"]
    refusal: Text


class InputImage(_Lenient):
    type: Literal["input_image"]
    image_url: str | None = Field(default=None, max_length=MAX_CHARS_HARD)
    file_id: str | None = Field(default=None, max_length=MAX_ID_CHARS)


Part = Annotated[InputText | OutputText | Refusal | InputImage, Field(discriminator="type")]
Content = str | Annotated[list[Part], Field(max_length=MAX_PARTS)]


def _text_of(content: Content) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.refusal if isinstance(p, Refusal) else getattr(p, "text", "") for p in content)


def _has_image(content: Content) -> bool:
    return not isinstance(content, str) and any(isinstance(p, InputImage) for p in content)


class MessageItem(_Lenient):
    type: Literal["message"] = "message"
    id: ItemId = None
    role: Literal["user", "assistant", "system", "developer"]
    content: Content


class FunctionCallItem(_Lenient):
    type: Literal["function_call"]
    id: ItemId = None
    call_id: str = Field(max_length=MAX_ID_CHARS)
    name: str = Field(pattern=FUNCTION_NAME)
    arguments: Text


class FunctionCallOutputItem(_Lenient):
    type: Literal["function_call_output"]
    id: ItemId = None
    call_id: str = Field(max_length=MAX_ID_CHARS)
    output: Content


class ReasoningText(_Lenient):
    type: Literal["reasoning_text"]
    text: Text


class ReasoningItem(_Lenient):
    """A reasoning model's item, sent back with its conversation: its text goes to the
    template with the assistant turn that follows it (`reasoning_content`: the template
    shows it or leaves it out); its summary and encrypted content are not read."""

    type: Literal["reasoning"]
    id: ItemId = None
    content: Annotated[list[ReasoningText], Field(max_length=MAX_PARTS)] | None = None

    def text(self) -> str:
        return "".join(part.text for part in self.content or [])


def _item_type(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("type") or "message")
    return str(getattr(value, "type", "message"))


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]
ITEMS: TypeAdapter[list[InputItem]] = TypeAdapter(list[InputItem])


def has_image(items: list[InputItem]) -> bool:
    return any(
        (isinstance(item, MessageItem) and _has_image(item.content))
        or (isinstance(item, FunctionCallOutputItem) and _has_image(item.output))
        for item in items
    )


def chat_messages(items: list[InputItem]) -> list[dict[str, Any]]:
    """The conversation as chat turns: consecutive function calls join the assistant turn
    before them; a reasoning item's text goes with the assistant turn after it."""
    messages: list[dict[str, Any]] = []
    thought = ""  # a reasoning item's, for the next assistant turn
    for item in items:
        if isinstance(item, ReasoningItem):
            thought += item.text()
        elif isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append({"role": role, "content": _text_of(item.content)})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif isinstance(item, FunctionCallOutputItem):
            text = _text_of(item.output)
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": text})
        answered = messages and messages[-1]["role"] == "assistant"
        if thought and answered and not isinstance(item, ReasoningItem):
            messages[-1]["reasoning_content"], thought = thought, ""
    return messages


def drop_oldest_turn(items: list[InputItem]) -> list[InputItem] | None:
    """`items` without their oldest turn (the first item that is no system or developer
    message, up to the next user message: a question with the calls and answers that
    followed it, so the roles still alternate), and without function outputs whose call
    went; None when nothing but the last item could go (it is what is to be answered)."""
    turns = [i for i, item in enumerate(items[:-1]) if not _is_role(item, "system", "developer")]
    if not turns:
        return None
    start = turns[0]
    users = [i for i in range(start + 1, len(items)) if _is_role(items[i], "user")]
    rest = items[:start] + items[users[0] if users else start + 1 :]
    calls = {item.call_id for item in rest if isinstance(item, FunctionCallItem)}
    kept = [i for i in rest if not isinstance(i, FunctionCallOutputItem) or i.call_id in calls]
    return kept if kept and kept[-1] is items[-1] else None


def _is_role(item: InputItem, *roles: str) -> bool:
    return isinstance(item, MessageItem) and item.role in roles


# -- the request ------------------------------------------------------------------------
class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = Field(default=None, max_length=MAX_CHARS_HARD)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # forced calls are always enforced

    def as_chat(self) -> dict[str, Any]:
        function = self.model_dump(exclude={"type"}, exclude_none=True)
        return {"type": "function", "function": function}


class FunctionChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    name: str = Field(max_length=64)


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, max_length=64)
    description: str | None = Field(default=None, max_length=MAX_CHARS_HARD)
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # always enforced: the output is constrained either way

    def as_chat(self) -> dict[str, Any]:
        if self.type != "json_schema":
            return {"type": self.type}
        if self.json_schema is None:
            raise InvalidRequest("text.format of type json_schema needs `schema`", param="text")
        schema = {"name": self.name or "answer", "schema": self.json_schema}
        return {"type": "json_schema", "json_schema": schema}


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, ignored


class ReasoningConfig(BaseModel):
    """`reasoning`: a reasoning model's effort (`none`: thinking off; app.models.chat.reasoning);
    no summaries are written (the thinking itself comes back, as `reasoning_text`)."""

    model_config = ConfigDict(extra="forbid")
    effort: OpenAIEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(BaseModel):
    """POST /v1/responses, every number bounded and every list capped."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(max_length=64, pattern=MODEL_NAME_PATTERN)
    input: str | Annotated[list[InputItem], Field(min_length=1, max_length=MAX_ITEMS)] = Field(
        max_length=MAX_CHARS_HARD
    )
    instructions: str | None = Field(default=None, max_length=MAX_CHARS_HARD)
    tools: list[FunctionTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_HARD)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    store: bool = True
    previous_response_id: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(
        default=None, max_length=MAX_METADATA
    )
    user: str | None = Field(default=None, max_length=MAX_CALLER_ID)
    prompt_cache_key: str | None = Field(default=None, max_length=MAX_CALLER_ID)
    safety_identifier: str | None = Field(default=None, max_length=MAX_CALLER_ID)
    truncation: Literal["auto", "disabled"] | None = None
    stream: bool = False
    keep_alive: KeepAlive = None
    service_tier: str | None = Field(default=None, max_length=32)

    @model_validator(mode="before")
    @classmethod
    def screen_fields(cls, data: Any) -> Any:
        return screen(data)[0]

    @model_validator(mode="after")
    def _metadata_keys(self) -> ResponsesRequest:
        if any(len(key) > 64 for key in self.metadata or {}):
            raise InvalidRequest("metadata keys have at most 64 characters", param="metadata")
        return self

    def items(self) -> list[InputItem]:
        """The input as items: a string is one user message."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    def caller_ids(self) -> tuple[str | None, ...]:
        """The ids that tell its caller apart (app.api.callers.cache_scope)."""
        return (self.user, self.prompt_cache_key, self.safety_identifier)

    def chat_request(self, items: list[InputItem]) -> ChatRequest:
        """The chat request these items (the conversation so far, this input last) make."""
        messages = chat_messages(items)
        if self.instructions:
            messages.insert(0, {"role": "system", "content": self.instructions})
        if not messages:
            raise InvalidRequest("input holds no message to answer", param="input")
        if len(messages) > MAX_MESSAGES:
            raise InvalidRequest(
                f"the conversation has {len(messages)} turns (previous_response_id's and "
                f"this input's); at most {MAX_MESSAGES} are allowed",
                param="input",
            )
        fields: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": self.stream,
            "keep_alive": self.keep_alive,
            "max_tokens": self.max_output_tokens,
            "tools": [tool.as_chat() for tool in self.tools or []] or None,
            "tool_choice": self._chat_tool_choice(),
            "parallel_tool_calls": self.parallel_tool_calls,
        }
        if self.text is not None and self.text.format is not None:
            fields["response_format"] = self.text.format.as_chat()
        if self.reasoning is not None and self.reasoning.effort is not None:
            fields["reasoning_effort"] = self.reasoning.effort
        fields |= {
            name: value
            for name in ("temperature", "top_p")
            if (value := getattr(self, name)) is not None
        }
        try:
            return ChatRequest.model_validate(fields)
        except ValidationError as exc:  # a bound of chat's that the items' own did not check
            raise from_validation_errors(exc.errors()) from None

    def _chat_tool_choice(self) -> str | dict[str, Any] | None:
        choice = self.tool_choice
        if isinstance(choice, FunctionChoice):
            return {"type": "function", "function": {"name": choice.name}}
        return choice

    def echoed(self) -> dict[str, Any]:
        """The request's settings as a Response object repeats them."""
        text_format = self.text.format if self.text and self.text.format else None
        return {
            "instructions": self.instructions,
            "tools": [tool.model_dump(exclude_none=True) for tool in self.tools or []],
            "tool_choice": (
                self.tool_choice.model_dump()
                if isinstance(self.tool_choice, FunctionChoice)
                else self.tool_choice or "auto"
            ),
            "parallel_tool_calls": self.parallel_tool_calls is not False,
            "text": {
                "format": (
                    text_format.model_dump(by_alias=True, exclude_none=True)
                    if text_format
                    else {"type": "text"}
                )
            },
            "temperature": self.temperature if self.temperature is not None else 1.0,
            "top_p": self.top_p if self.top_p is not None else 1.0,
            "max_output_tokens": self.max_output_tokens,
            "store": self.store,
            "metadata": self.metadata or {},
            "user": self.user,
            "prompt_cache_key": self.prompt_cache_key,
            "safety_identifier": self.safety_identifier,
            "truncation": self.truncation or "disabled",
            "previous_response_id": self.previous_response_id,
            "reasoning": {
                "effort": self.reasoning.effort if self.reasoning else None,
                "summary": None,
            },
        }


_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


# chat's names for the fields its errors name, as this API calls them
_CHAT_PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text"}


def in_responses_terms(error: InvalidRequest) -> InvalidRequest:
    """A chat request's error, naming the Responses field that made the chat field."""
    param = _CHAT_PARAMS.get(error.param or "")
    if param is None:
        return error
    error.param = param  # one request's own error: its kind and words stay
    return error


def dumped_items(items: list[InputItem]) -> list[dict[str, Any]]:
    """Items as JSON objects to store and list (GET .../input_items): each with an id, a
    message's text as a part, as OpenAI lists them."""
    dumped = []
    for item in items:
        found = json.loads(item.model_dump_json(exclude_none=True))
        found.setdefault("id", f"{_ID_PREFIX[found['type']]}_{uuid.uuid4().hex}")
        if found["type"] == "message":
            found.setdefault("status", "completed")
            if isinstance(found["content"], str):
                kind = "output_text" if found["role"] == "assistant" else "input_text"
                found["content"] = [{"type": kind, "text": found["content"]}]
            for part in found["content"]:
                if part["type"] == "output_text":
                    part.setdefault("annotations", [])
        dumped.append(found)
    return dumped
