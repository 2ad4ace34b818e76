"""OpenAI-compatible routes: parse → validated request → service → encode."""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from app.api.errors import from_validation_errors
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


def disconnected(request: Request) -> Callable[[], Awaitable[None]]:
    """Waits until the client goes away (the body has been read already). The service
    only starts this when a request has to wait, so most requests never pay for it."""

    async def wait() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    return wait


# The body is read and validated here, in pydantic's Rust JSON validator, rather than by
# FastAPI's body machinery (a tenth of the event loop's time per request); the schema
# stays in the OpenAPI document.
EMBEDDINGS_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": EmbeddingRequest.model_json_schema()}},
    }
}


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


@router.post("/embeddings", openapi_extra=EMBEDDINGS_OPENAPI)
async def create_embeddings(request: Request) -> Response:
    """Also served by `HotRoutes` (see HOT_ROUTES), past the framework's layers."""

    service = _service(request)
    try:
        body = EmbeddingRequest.model_validate_json(await request.body())
    except ValidationError as exc:
        raise from_validation_errors(exc.errors()) from None
    valid = validate_embedding_request(body, service.settings)
    result = await service.embed(valid.model, valid.texts, gone=disconnected(request))
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


# The routes that carry the load, for app.api.hot.HotRoutes.
HOT_ROUTES = {("POST", "/v1/embeddings"): create_embeddings}
