"""Reranking: `POST /v1/rerank` (also `/rerank`), in the shape Cohere and Jina define.

`query` and `documents` (strings, or objects with `text`); `top_n` (default: all) and
`return_documents`; the answer's `results` are sorted by `relevance_score`, each with
the document's `index`. Bad input (no documents, too many, an empty query, more text
than `max_input_chars`) is a 400 before anything is queued; the pairs are priced and
batched as embeddings are.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from app.api.intake import (
    client_watch,
    fleet_of,
    read_parsed,
)
from app.api.openai.schemas import MAX_CHARS_HARD, KeepAlive
from app.config.settings import MODEL_NAME_PATTERN
from app.core.requests import ValidRerankRequest
from app.errors import InvalidRequest

router = APIRouter(tags=["rerank"])
MAX_DOCUMENTS = 1000  # Cohere's bound


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: str = Field(max_length=MAX_CHARS_HARD)


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # Cohere's and Jina's other fields
    model: str = Field(max_length=64, pattern=MODEL_NAME_PATTERN)
    query: str = Field(min_length=1, max_length=MAX_CHARS_HARD)
    documents: list[str | RerankDocument] = Field(min_length=1, max_length=MAX_DOCUMENTS)
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False
    keep_alive: KeepAlive = None

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


async def rerank(request: Request) -> Response:
    fleet = fleet_of(request)
    body = await read_parsed(request, RerankRequest)
    documents = body.texts()
    chars = len(body.query) * len(documents) + sum(len(d) for d in documents)
    if chars > fleet.settings.max_input_chars:
        raise InvalidRequest(
            f"the query with each document has {chars} characters; at most "
            f"{fleet.settings.max_input_chars} are allowed",
            param="documents",
        )
    valid = ValidRerankRequest(
        body.model, body.query, documents, body.top_n, body.return_documents, body.keep_alive
    )
    with client_watch(request) as watch:
        result = await fleet.run(valid, watch)
    ranked = sorted(range(len(documents)), key=lambda i: -float(result.output[i]))
    results: list[dict[str, Any]] = []
    for index in ranked[: body.top_n or len(documents)]:
        row: dict[str, Any] = {"index": index, "relevance_score": float(result.output[index])}
        if body.return_documents:
            row["document"] = {"text": documents[index]}
        results.append(row)
    cost = result.cost
    payload = {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": body.model,
        "results": results,
        "usage": {
            "total_tokens": result.tokens,
            "queue_ms": round(cost.queue_s * 1000, 3),
            "run_ms": round(cost.run_s * 1000, 3),
            "vram_bytes": cost.price_bytes,
            "batch": cost.batch,
        },
    }
    return Response(orjson.dumps(payload), media_type="application/json", headers=cost.headers())


for path in ("/v1/rerank", "/rerank"):
    router.add_api_route(path, rerank, methods=["POST"], summary="Rerank documents for a query")
