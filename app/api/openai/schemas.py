"""Request bodies as clients send them. Every number is bounded and every list and string
capped before anything is queued; each body becomes one of app.core.requests' validated
types, the only requests the core sees."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from app.api.callers import MAX_CALLER_ID
from app.api.chat_images import check_image_count, url_image
from app.api.openai.fields import screen
from app.config.durations import parse_keep_alive
from app.config.model_spec import MAX_STOP, MAX_STOP_CHARS, REQUESTED_MODEL_PATTERN
from app.config.settings import Settings
from app.core.requests import ValidEmbeddingRequest, ValidGenerationRequest
from app.errors import InvalidRequest
from app.models import structured
from app.models.chat.reasoning import OpenAIEffort, ThinkingAsk
from app.models.decoding import ANY_OBJECT, Chat, Prompt, SamplingParams
from app.models.tools import call_schema

# Outer bounds; the configured limits (Settings.max_inputs, max_input_chars) are tighter.
MAX_INPUTS_HARD = 4096
MAX_CHARS_HARD = 10_000_000


def _keep_alive(value: object) -> float | None:
    """Ollama's keep_alive: a duration (30s, 5m, 1h, seconds), 0, or -1 (for good)."""
    return None if value is None else parse_keep_alive(value)


KeepAlive = Annotated[float | None, BeforeValidator(_keep_alive)]
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings request (app.api.openai.fields: what each field does)."""

    model_config = ConfigDict(extra="forbid")
    input: str | list[str] | list[TokenId] | list[list[TokenId]] = Field(max_length=MAX_CHARS_HARD)
    model: str = Field(max_length=200, pattern=REQUESTED_MODEL_PATTERN)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, le=65_536)
    keep_alive: KeepAlive = None
    service_tier: str | None = Field(default=None, max_length=32)
    priority: int | None = Field(default=None, ge=-(2**31), le=2**31 - 1)

    @model_validator(mode="before")
    @classmethod
    def screen_fields(cls, data: Any) -> Any:
        return screen("embeddings", data)


def validate_embedding_request(body: EmbeddingRequest, settings: Settings) -> ValidEmbeddingRequest:
    raw = body.input
    one = isinstance(raw, str) or bool(raw and isinstance(raw[0], int))  # a text, or ids
    inputs: list[str | list[int]] = [raw] if one else list(raw)  # type: ignore[list-item,arg-type]
    if not inputs:
        raise InvalidRequest("input must not be empty", param="input")
    if len(inputs) > settings.max_inputs:
        raise InvalidRequest(
            f"input has {len(inputs)} items; at most {settings.max_inputs} are allowed",
            param="input",
        )
    for index, item in enumerate(inputs):
        if not (item.strip() if isinstance(item, str) else item):
            raise InvalidRequest(f"input[{index}] is empty", param="input")
        if len(item) > settings.max_input_chars:
            unit = "characters" if isinstance(item, str) else "tokens"
            raise InvalidRequest(
                f"input[{index}] has {len(item)} {unit}; at most "
                f"{settings.max_input_chars} are allowed",
                param="input",
            )
    return ValidEmbeddingRequest(
        body.model, inputs, body.encoding_format, body.dimensions, body.keep_alive
    )


# -- text generation ------------------------------------------------------------------------
MAX_MESSAGES = 512
MAX_TOKENS_HARD = 1_048_576
MAX_LOGIT_BIAS = 1024
MAX_CHOICES = 16
MAX_TOOLS = 128
SEED_MAX = 2**63 - 1


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str = Field(max_length=MAX_CHARS_HARD)


class ImageUrl(BaseModel):
    url: str = Field(max_length=MAX_CHARS_HARD)  # a data URL (app.api.chat_images)
    detail: Literal["auto", "low", "high"] | None = None  # the model's processor decides


class ImagePart(BaseModel):
    """An image for a model that sees (app.api.chat_images)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["image_url"]
    image_url: ImageUrl


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class CalledFunction(BaseModel):
    name: str = Field(max_length=64)
    arguments: str = Field(max_length=MAX_CHARS_HARD)


class ToolCall(BaseModel):
    """A call an assistant turn made, as the model's earlier answer gave it."""

    id: str = Field(max_length=128)
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    """A chat turn. Content is text, or a list of text and image parts (images for a
    model that sees); an assistant turn may carry tool calls instead, and a `tool` turn
    answers one."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = Field(default=None, max_length=MAX_CHARS_HARD)
    name: str | None = Field(default=None, max_length=64)
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_call_id: str | None = Field(default=None, max_length=128)
    refusal: str | None = Field(default=None, max_length=MAX_CHARS_HARD)  # sent back as given
    # an earlier answer's thinking, sent back: its template shows it or leaves it out
    reasoning_content: str | None = Field(default=None, max_length=MAX_CHARS_HARD)

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content if isinstance(part, TextPart))

    def image_urls(self) -> list[str]:
        if self.content is None or isinstance(self.content, str):
            return []
        return [part.image_url.url for part in self.content if isinstance(part, ImagePart)]

    def as_dict(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        if self.reasoning_content:
            message["reasoning_content"] = self.reasoning_content
        return message


class FunctionDefinition(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = Field(default=None, max_length=MAX_CHARS_HARD)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # forced calls are always enforced


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str = Field(max_length=64)


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: NamedFunction


class JsonSchema(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(max_length=64)
    description: str | None = Field(default=None, max_length=MAX_CHARS_HARD)
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # always enforced: the output is constrained either way


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: `text`, `json_object` (any JSON object), or
    `json_schema` (JSON valid against the schema; app.engines.torch.generation.constrained)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None

    def schema_text(self) -> str | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return ANY_OBJECT
        if self.json_schema is None:
            raise InvalidRequest(
                "response_format of type json_schema needs `json_schema`",
                param="response_format",
            )
        return json.dumps(self.json_schema.json_schema or {})


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _GenerationFields(BaseModel):
    """What chat and completions share; every number bounded."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(max_length=200, pattern=REQUESTED_MODEL_PATTERN)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_HARD)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = Field(default=None, max_length=MAX_STOP)
    seed: int | None = Field(default=None, ge=0, le=SEED_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    keep_alive: KeepAlive = None
    service_tier: str | None = Field(default=None, max_length=32)
    priority: int | None = Field(default=None, ge=-(2**31), le=2**31 - 1)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    logit_bias: dict[str, float] | None = Field(default=None, max_length=MAX_LOGIT_BIAS)
    top_k: int = Field(default=0, ge=-1, le=1_000_000)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    user: str | None = Field(default=None, max_length=MAX_CALLER_ID)

    def caller_ids(self) -> tuple[str | None, ...]:
        """The ids that tell its caller apart (app.api.callers.cache_scope)."""
        return (self.user,)

    def sampling(self) -> SamplingParams:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        for stop in stops:
            if not stop or len(stop) > MAX_STOP_CHARS:
                raise InvalidRequest(
                    f"each stop sequence must have 1 to {MAX_STOP_CHARS} characters",
                    param="stop",
                )
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=tuple(stops),
            seed=self.seed,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=_logit_bias(self.logit_bias),
            top_k=max(self.top_k, 0),
            min_p=self.min_p,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


def _logit_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias`: token ids (as JSON object keys) to -100..100."""
    pairs = []
    for key, value in (bias or {}).items():
        if not key.isdigit() or not -100 <= value <= 100:
            raise InvalidRequest(
                f"logit_bias maps token ids to numbers from -100 to 100; got {key!r}: {value!r}",
                param="logit_bias",
            )
        pairs.append((int(key), float(value)))
    return tuple(pairs)


class ChatRequest(_GenerationFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_HARD)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    parallel_tool_calls: bool | None = None
    prompt_cache_key: str | None = Field(default=None, max_length=MAX_CALLER_ID)
    safety_identifier: str | None = Field(default=None, max_length=MAX_CALLER_ID)
    # a reasoning model's thinking: OpenAI's effort (`none`: off), llama.cpp's budget
    reasoning_effort: OpenAIEffort | None = None
    reasoning_budget_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS_HARD)

    def caller_ids(self) -> tuple[str | None, ...]:
        return (*super().caller_ids(), self.prompt_cache_key, self.safety_identifier)

    def thinking(self) -> ThinkingAsk:
        """What it asks of a reasoning model's thinking (app.models.chat.reasoning)."""
        return ThinkingAsk.from_effort(self.reasoning_effort, self.reasoning_budget_tokens)

    @model_validator(mode="before")
    @classmethod
    def screen_fields(cls, data: Any) -> Any:
        return screen("chat", data)

    def as_prompt(self, settings: Settings) -> Prompt:
        messages = [m.as_dict() for m in self.messages]
        _check_chars(sum(len(m["content"]) for m in messages), settings, "messages")
        check_image_count(self.image_count(), settings, "messages")
        for message, body in zip(messages, self.messages, strict=True):
            if urls := body.image_urls():
                message["images"] = [url_image(url, settings, "messages") for url in urls]
        tools = [tool.model_dump(exclude_none=True) for tool in self.tools or []]
        return Chat(messages, tools if self.tool_mode() != "none" else None, self.thinking())

    def image_count(self) -> int:
        return sum(len(m.image_urls()) for m in self.messages)

    def tool_mode(self) -> Literal["none", "auto", "forced"]:
        """Whether the answer may (auto) or must (forced) be a call to one of `tools`."""
        choice = self.tool_choice
        if not self.tools:
            if choice not in (None, "none", "auto"):
                raise InvalidRequest(
                    "tool_choice asks for a call but no tools are given", param="tool_choice"
                )
            return "none"
        if isinstance(choice, NamedToolChoice):
            if choice.function.name not in self.tool_names():
                raise InvalidRequest(
                    f"tool_choice names {choice.function.name!r}, which is not in tools",
                    param="tool_choice",
                )
            return "forced"
        return {"none": "none", "required": "forced"}.get(choice or "auto", "auto")  # type: ignore[return-value]

    def tool_names(self) -> frozenset[str]:
        return frozenset(tool.function.name for tool in self.tools or [])

    def sampling(self) -> SamplingParams:
        params = super().sampling()
        if self.max_completion_tokens is not None and self.max_tokens is None:
            params = replace(params, max_tokens=self.max_completion_tokens)
        if self.response_format is not None:
            params = replace(params, json_schema=self.response_format.schema_text())
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        if self.logprobs:
            params = replace(params, logprobs=self.top_logprobs or 0)
        if self.tool_mode() == "forced":
            if params.json_schema is not None:
                raise InvalidRequest(
                    "a forced tool call and a response_format cannot both shape the answer",
                    param="response_format",
                )
            tools = [tool.model_dump(exclude_none=True) for tool in self.tools or []]
            choice = self.tool_choice
            named = choice.function.name if isinstance(choice, NamedToolChoice) else None
            params = replace(params, json_schema=json.dumps(call_schema(tools, named)))
        if params.json_schema is not None:  # one that cannot be enforced: 400, any engine
            where = "tools" if self.tool_mode() == "forced" else "response_format"
            if (refused := structured.refusal(params.json_schema, where)) is not None:
                raise refused
        return params


class CompletionRequest(_GenerationFields):
    prompt: str | list[str] = Field(max_length=MAX_CHARS_HARD)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False

    def sampling(self) -> SamplingParams:
        if self.echo and self.logprobs is not None:
            raise InvalidRequest(
                "echo with logprobs needs the prompt's log-probabilities, which are not "
                "computed; ask for one or the other",
                param="echo",
            )
        return replace(super().sampling(), logprobs=self.logprobs)

    @model_validator(mode="before")
    @classmethod
    def screen_fields(cls, data: Any) -> Any:
        return screen("completions", data)

    def as_prompt(self, settings: Settings) -> Prompt:
        if isinstance(self.prompt, list):
            if len(self.prompt) != 1:
                raise InvalidRequest("exactly one prompt per request is supported", param="prompt")
            prompt = self.prompt[0]
        else:
            prompt = self.prompt
        if not prompt:
            raise InvalidRequest("the prompt is empty", param="prompt")
        _check_chars(len(prompt), settings, "prompt")
        return prompt


def validate_generation_request(
    body: ChatRequest | CompletionRequest, settings: Settings
) -> ValidGenerationRequest:
    """The request as the core takes it (a 400 for what fails a configured bound)."""
    prompt = body.as_prompt(settings)
    tool_mode, names, parallel = "none", frozenset[str](), True
    if isinstance(body, ChatRequest):
        tool_mode, names = body.tool_mode(), body.tool_names()
        parallel = body.parallel_tool_calls is not False
    return ValidGenerationRequest(
        body.model,
        prompt,
        body.sampling(),
        body.stream,
        body.include_usage,
        body.n,
        tool_mode,
        names,
        echo=isinstance(body, CompletionRequest) and body.echo,
        parallel_tool_calls=parallel,
        keep_alive=body.keep_alive,
    )


def _check_chars(chars: int, settings: Settings, param: str) -> None:
    if chars > settings.max_input_chars:
        raise InvalidRequest(
            f"{param} has {chars} characters; at most {settings.max_input_chars} are allowed",
            param=param,
        )


# -- images ---------------------------------------------------------------------------------
MAX_BASE64_CHARS = 100_000_000


class PredictRequest(BaseModel):
    """JSON form of a prediction: base64 images (PNG, JPEG, WebP...)."""

    model_config = ConfigDict(extra="forbid")
    image: str | list[str] = Field(max_length=MAX_BASE64_CHARS)
    top_k: int = Field(default=5, ge=1, le=1000)
    keep_alive: KeepAlive = None
