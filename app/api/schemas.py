"""Request bodies as clients send them. Every number is bounded and every list and string
capped before anything is queued; each body becomes one of app.core.requests' validated
types, the only requests the core sees."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.core.requests import ValidEmbeddingRequest, ValidGenerationRequest
from app.errors import InvalidRequest
from app.models.decoding import Prompt, SamplingParams
from app.settings import MODEL_NAME_PATTERN, Settings

# Outer bounds; the configured limits (Settings.max_inputs, max_input_chars) are tighter.
MAX_INPUTS_HARD = 4096
MAX_CHARS_HARD = 10_000_000


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings request. Token-id inputs are not supported."""

    model_config = ConfigDict(extra="forbid")
    input: str | list[str] = Field(max_length=MAX_CHARS_HARD)
    model: str = Field(max_length=64, pattern=MODEL_NAME_PATTERN)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, le=65_536)
    user: str | None = Field(default=None, max_length=256)


def validate_embedding_request(body: EmbeddingRequest, settings: Settings) -> ValidEmbeddingRequest:
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    if not texts:
        raise InvalidRequest("input must not be empty", param="input")
    if len(texts) > settings.max_inputs:
        raise InvalidRequest(
            f"input has {len(texts)} items; at most {settings.max_inputs} are allowed",
            param="input",
        )
    for index, text in enumerate(texts):
        if not text.strip():
            raise InvalidRequest(f"input[{index}] is empty", param="input")
        if len(text) > settings.max_input_chars:
            raise InvalidRequest(
                f"input[{index}] has {len(text)} characters; at most "
                f"{settings.max_input_chars} are allowed",
                param="input",
            )
    return ValidEmbeddingRequest(body.model, texts, body.encoding_format, body.dimensions)


# -- text generation ------------------------------------------------------------------------
MAX_MESSAGES = 512
MAX_TOKENS_HARD = 1_048_576
MAX_STOP = 4
MAX_STOP_CHARS = 64
SEED_MAX = 2**63 - 1


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str = Field(max_length=MAX_CHARS_HARD)


class ChatMessage(BaseModel):
    """A chat turn. Content is text, or a list of text parts (images are not supported)."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] = Field(max_length=MAX_CHARS_HARD)
    name: str | None = Field(default=None, max_length=64)

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _GenerationFields(BaseModel):
    """What chat and completions share; every number bounded."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(max_length=64, pattern=MODEL_NAME_PATTERN)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_HARD)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = Field(default=None, max_length=MAX_STOP)
    seed: int | None = Field(default=None, ge=0, le=SEED_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    user: str | None = Field(default=None, max_length=256)

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
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(_GenerationFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_HARD)

    def as_prompt(self, settings: Settings) -> Prompt:
        messages = [{"role": m.role, "content": m.text()} for m in self.messages]
        _check_chars(sum(len(m["content"]) for m in messages), settings, "messages")
        return messages

    def sampling(self) -> SamplingParams:
        params = super().sampling()
        if self.max_completion_tokens is not None and self.max_tokens is None:
            return replace(params, max_tokens=self.max_completion_tokens)
        return params


class CompletionRequest(_GenerationFields):
    prompt: str | list[str] = Field(max_length=MAX_CHARS_HARD)
    echo: Literal[False] = False

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
    return ValidGenerationRequest(
        body.model, prompt, body.sampling(), body.stream, body.include_usage
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
