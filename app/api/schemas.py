"""Request and response types. Every number is bounded and every list and string capped
before anything is queued; `ValidEmbeddingRequest` is the only type the service sees."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.errors import InvalidRequest
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


@dataclass(frozen=True)
class ValidEmbeddingRequest:
    model: str
    texts: list[str]
    encoding_format: Literal["float", "base64"]
    dimensions: int | None


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
