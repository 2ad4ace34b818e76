"""Ollama's request bodies, and their translation into the OpenAI requests the rest of
the server validates, prices and runs (app.api.openai.schemas): one path for both APIs, so an
Ollama request passes the same guard, gate and pricing as an OpenAI one.

Fields as Ollama's API documents them; `options` carries the sampling settings
(`num_predict` is `max_tokens`, `repeat_penalty` is `repetition_penalty`; `num_ctx` is
accepted and ignored: vramgate prices each request by its own tokens). Unknown fields
are ignored, as Ollama does. `think` (true, false, or "low"/"medium"/"high") is a
reasoning model's switch, as chat's `reasoning_effort`; an assistant turn's `thinking`
goes back to its template as `reasoning_content`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.api.openai.schemas import (
    MAX_CHARS_HARD,
    MAX_MESSAGES,
    MAX_TOOLS,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    KeepAlive,
    Tool,
)
from app.config.model_spec import REQUESTED_MODEL_PATTERN
from app.errors import InvalidRequest

ModelName = Field(max_length=200, pattern=REQUESTED_MODEL_PATTERN)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Options(_Body):
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    num_predict: int | None = None  # -1 (or -2): as long as the model goes
    stop: str | list[str] | None = None
    seed: int | None = None
    num_ctx: int | None = None  # ignored: each request is priced by its own tokens
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def sampling(self) -> dict[str, Any]:
        """These options as OpenAI request fields."""
        fields: dict[str, Any] = {
            name: value
            for name in ("temperature", "top_p", "top_k", "min_p", "stop", "seed")
            if (value := getattr(self, name)) is not None
        }
        fields |= {
            name: value
            for name in ("presence_penalty", "frequency_penalty")
            if (value := getattr(self, name)) is not None
        }
        if self.repeat_penalty is not None:
            fields["repetition_penalty"] = self.repeat_penalty
        if self.num_predict is not None and self.num_predict > 0:
            fields["max_tokens"] = self.num_predict
        return fields


MAX_IMAGES = 256  # the configured max_images is tighter


def image_parts(images: list[str], text: str) -> list[dict[str, Any]]:
    """Ollama's base64 `images` and a text as OpenAI's content parts (the images checked
    where chat's are: app.api.chat_images)."""
    parts = [{"type": "image_url", "image_url": {"url": f"{BASE64_URL}{i}"}} for i in images]
    return [*parts, {"type": "text", "text": text}]


BASE64_URL = "data:image;base64,"  # the format is read from the image itself


class CalledFunction(_Body):
    name: str = Field(max_length=64)
    arguments: dict[str, Any] = Field(default_factory=dict)


class OllamaToolCall(_Body):
    function: CalledFunction


class OllamaMessage(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field(default="", max_length=MAX_CHARS_HARD)
    images: list[str] | None = Field(default=None, max_length=MAX_IMAGES)  # base64
    tool_calls: list[OllamaToolCall] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_name: str | None = Field(default=None, max_length=64)
    thinking: str | None = Field(default=None, max_length=MAX_CHARS_HARD)

    def as_openai(self, index: int) -> dict[str, Any]:
        content = image_parts(self.images, self.content) if self.images else self.content
        message: dict[str, Any] = {"role": self.role, "content": content}
        if self.thinking and self.role == "assistant":
            message["reasoning_content"] = self.thinking
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{index}_{i}",
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": json.dumps(call.function.arguments),
                    },
                }
                for i, call in enumerate(self.tool_calls)
            ]
        if self.role == "tool":
            message["tool_call_id"] = self.tool_name or "call"
        return message


Format = Literal["json"] | dict[str, Any] | None


def _format(fmt: Format) -> dict[str, Any] | None:
    """Ollama's `format` ("json", or a JSON schema) as an OpenAI `response_format`."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}


_THINK_AS_EFFORT: dict[bool | str, str] = {True: "medium", False: "none"}


class _Generation(_Body):
    model: str = ModelName
    format: Format = None
    options: Options | None = None
    stream: bool = True
    keep_alive: KeepAlive = None
    think: bool | Literal["low", "medium", "high"] | None = None

    def _common(self) -> dict[str, Any]:
        fields = {"model": self.model, "stream": self.stream, "keep_alive": self.keep_alive}
        if self.think is not None:  # true: the middle level (gpt-oss's default)
            fields["reasoning_effort"] = _THINK_AS_EFFORT.get(self.think, self.think)
        return fields | (self.options.sampling() if self.options else {})


class ChatBody(_Generation):
    # none: Ollama's load (and with keep_alive 0, unload) idiom (app.api.ollama.routes)
    messages: list[OllamaMessage] = Field(default_factory=list, max_length=MAX_MESSAGES)
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)

    def chat_request(self) -> ChatRequest:
        fields = self._common() | {
            "messages": [m.as_openai(i) for i, m in enumerate(self.messages)],
            "tools": [tool.model_dump(exclude_none=True) for tool in self.tools or []] or None,
            "response_format": _format(self.format),
        }
        return ChatRequest.model_validate(fields)


class GenerateBody(_Generation):
    prompt: str = Field(default="", max_length=MAX_CHARS_HARD)
    system: str | None = Field(default=None, max_length=MAX_CHARS_HARD)
    raw: bool = False  # the prompt as it is, without the model's chat template
    images: list[str] | None = Field(default=None, max_length=MAX_IMAGES)  # base64
    suffix: str | None = None

    def chat_request(self) -> ChatRequest | CompletionRequest:
        if self.images and self.raw:
            raise InvalidRequest("images need the chat template: not with raw", param="images")
        if self.suffix:
            raise InvalidRequest("suffix (fill-in-the-middle) is not supported", param="suffix")
        if self.raw:
            if self.format is not None:
                raise InvalidRequest("format needs the chat template: not with raw", param="format")
            return CompletionRequest.model_validate(self._common() | {"prompt": self.prompt})
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system}]
        messages = messages if self.system else []
        content = image_parts(self.images, self.prompt) if self.images else self.prompt
        messages.append({"role": "user", "content": content})
        fields = self._common() | {"messages": messages, "response_format": _format(self.format)}
        return ChatRequest.model_validate(fields)


class EmbedBody(_Body):
    model: str = ModelName
    input: str | list[str] = Field(max_length=MAX_CHARS_HARD)
    truncate: bool = True
    dimensions: int | None = None
    keep_alive: KeepAlive = None
    options: dict[str, Any] | None = None

    def embedding_request(self) -> EmbeddingRequest:
        return EmbeddingRequest.model_validate(
            {
                "model": self.model,
                "input": self.input,
                "dimensions": self.dimensions,
                "keep_alive": self.keep_alive,
            }
        )


class EmbeddingsBody(_Body):
    """The older /api/embeddings: one `prompt`, one `embedding`."""

    model: str = ModelName
    prompt: str = Field(max_length=MAX_CHARS_HARD)
    keep_alive: KeepAlive = None
    options: dict[str, Any] | None = None


class NamedBody(_Body):
    """/api/show, /api/delete, /api/pull: `model` (or the older `name`)."""

    model: str | None = Field(default=None, max_length=4096)
    name: str | None = Field(default=None, max_length=4096)
    stream: bool = True
    insecure: bool = False

    @property
    def target(self) -> str:
        target = self.model or self.name
        if not target:
            raise InvalidRequest("name the model: `model`", param="model")
        return target
