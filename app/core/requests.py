"""Validated requests: what the routes hand the core. Each is built by app.api.schemas
after every check that needs no model (bounds, lengths, formats) has passed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.models.decoding import Prompt, SamplingParams


@dataclass(frozen=True)
class ValidEmbeddingRequest:
    model: str
    inputs: list[str | list[int]]  # texts, or token ids of the model's own tokenizer
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    keep_alive: float | None = None  # seconds its model stays loaded idle (inf: for good)


@dataclass(frozen=True)
class ValidImageRequest:
    model: str
    images: list[bytes]
    top_k: int = 5
    keep_alive: float | None = None


@dataclass(frozen=True)
class ValidGenerationRequest:
    model: str
    prompt: Prompt
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    n: int = 1  # choices: each runs as a stream of its own
    tool_mode: str = "none"  # "auto": the answer may be a tool call; "forced": it must be
    tool_names: frozenset[str] = frozenset()
    echo: bool = False  # completions: the answer begins with the prompt
    parallel_tool_calls: bool = True  # False: at most one tool call in an answer
    keep_alive: float | None = None


@dataclass(frozen=True)
class ValidRerankRequest:
    model: str
    query: str
    documents: list[str]
    top_n: int | None = None  # None: every document
    return_documents: bool = False
    keep_alive: float | None = None
