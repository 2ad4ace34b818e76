"""OpenAI-compatible routes: parse → validated request → service → encode."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.api.schemas import (
    EmbeddingRequest,
    ValidEmbeddingRequest,
    validate_embedding_request,
)
from app.errors import InvalidRequest
from app.service import EmbeddingResult, InferenceService

router = APIRouter(prefix="/v1", tags=["openai"])
_STARTED = int(time.time())


def _service(request: Request) -> InferenceService:
    return request.app.state.service


@contextlib.asynccontextmanager
async def disconnect_watch(request: Request) -> AsyncIterator[asyncio.Event]:
    """An event set when the client goes away (the body has been read already)."""
    gone = asyncio.Event()

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone.set()
                return

    task = asyncio.create_task(watch())
    try:
        yield gone
    finally:
        task.cancel()


@router.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    entries = _service(request).registry.describe()
    data = [
        {
            "id": e["name"],
            "object": "model",
            "created": _STARTED,
            "owned_by": "vramgate",
            "kind": e["kind"],
            "state": e["state"],
        }
        for e in entries
    ]
    return {"object": "list", "data": data}


@router.post("/embeddings")
async def create_embeddings(body: EmbeddingRequest, request: Request) -> Response:
    service = _service(request)
    valid = validate_embedding_request(body, service.settings)
    async with disconnect_watch(request) as gone:
        result = await service.embed(valid.model, valid.texts, gone=gone)
    if valid.dimensions is not None and valid.dimensions != result.vectors.shape[1]:
        raise InvalidRequest(
            f"model {valid.model!r} makes {result.vectors.shape[1]}-dimensional vectors; "
            f"dimensions={valid.dimensions} is not supported",
            param="dimensions",
        )
    return Response(
        encode_embeddings(valid, result),
        media_type="application/json",
        headers=result.cost.headers(),
    )


def encode_embeddings(valid: ValidEmbeddingRequest, result: EmbeddingResult) -> bytes:
    vectors = result.vectors
    if valid.encoding_format == "base64":
        rows: list[Any] = [
            base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in vectors
        ]
    else:
        rows = list(vectors)
    cost = result.cost
    payload = {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)
        ],
        "model": valid.model,
        "usage": {
            "prompt_tokens": result.tokens,
            "total_tokens": result.tokens,
            "queue_ms": round(cost.queue_s * 1000, 3),
            "run_ms": round(cost.run_s * 1000, 3),
            "vram_bytes": cost.price_bytes,
            "batch": cost.batch,
        },
    }
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
