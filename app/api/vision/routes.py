"""Image models: `POST /v1/models/{model}/predict` with a multipart upload (`image`
fields) or JSON with base64 (`{"image": "...", "top_k": 5}`). Class scores come back as
JSON; an image-to-image model's single output as the PNG itself (`image/png`, `nosniff`),
several as JSON with base64 PNGs."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from fastapi.responses import Response

from app.api.intake import (
    client_watch,
    fleet_of,
    pixel_usage,
    read_parsed,
)
from app.api.openai.schemas import PredictRequest
from app.config.durations import parse_keep_alive
from app.config.settings import MODEL_NAME_PATTERN, Settings
from app.core.requests import ValidImageRequest
from app.core.work import InferenceResult
from app.errors import InvalidRequest

router = APIRouter(prefix="/v1", tags=["vision"])

OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/PredictRequest"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["image"],
                    "properties": {
                        "image": {"type": "string", "format": "binary"},
                        "top_k": {"type": "integer", "minimum": 1, "maximum": 1000},
                    },
                }
            },
        },
    }
}
RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "class scores (JSON), or the output image (PNG)",
        "content": {"image/png": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.post("/models/{model}/predict", openapi_extra=OPENAPI, responses=RESPONSES)
async def predict(
    request: Request, model: str = PathParam(max_length=64, pattern=MODEL_NAME_PATTERN)
) -> Response:
    fleet = fleet_of(request)
    valid = await read_images(request, model, fleet.settings)
    with client_watch(request) as watch:
        result = await fleet.run(valid, watch)
    headers = {**result.cost.headers(), "X-Content-Type-Options": "nosniff"}
    if isinstance(result.output, np.ndarray):
        labels = fleet.card(model).labels
        body = scores_body(model, result, labels, valid.top_k)
        return Response(orjson.dumps(body), media_type="application/json", headers=headers)
    if len(result.output) == 1:
        return Response(result.output[0], media_type="image/png", headers=headers)
    data = [
        {"index": i, "b64_png": base64.b64encode(png).decode("ascii")}
        for i, png in enumerate(result.output)
    ]
    body = {"object": "list", "model": model, "data": data, "usage": pixel_usage(result)}
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)


async def read_images(request: Request, model: str, settings: Settings) -> ValidImageRequest:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        form = await request.form(max_files=settings.max_images, max_fields=8)
        try:
            uploads = form.getlist("image")
            images = [await u.read() for u in uploads if not isinstance(u, str)]
            top_k = _top_k(form.get("top_k"))
            keep = _keep_alive(form.get("keep_alive"))
        finally:
            await form.close()
    else:
        body = await read_parsed(request, PredictRequest)
        encoded = [body.image] if isinstance(body.image, str) else body.image
        try:
            images = [base64.b64decode(item, validate=True) for item in encoded]
        except (binascii.Error, ValueError):
            raise InvalidRequest("image is not valid base64", param="image") from None
        top_k, keep = body.top_k, body.keep_alive
    if not images:
        raise InvalidRequest("send at least one image (the `image` field)", param="image")
    if len(images) > settings.max_images:
        raise InvalidRequest(
            f"{len(images)} images; at most {settings.max_images} per request", param="image"
        )
    return ValidImageRequest(model, images, top_k, keep)


def _keep_alive(value: Any) -> float | None:
    if value is None or not isinstance(value, str):
        return None
    try:
        return parse_keep_alive(value)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="keep_alive") from None


def _top_k(value: Any) -> int:
    if value is None:
        return 5
    if not isinstance(value, str) or not value.isdigit() or not 1 <= int(value) <= 1000:
        raise InvalidRequest("top_k must be an integer from 1 to 1000", param="top_k")
    return int(value)


def scores_body(
    model: str, result: InferenceResult, labels: Sequence[str], top_k: int
) -> dict[str, Any]:
    data = []
    for index, row in enumerate(result.output):
        best = np.argsort(-row)[:top_k]
        predictions = [
            {"label": labels[i] if i < len(labels) else str(int(i)), "score": float(row[i])}
            for i in best
        ]
        data.append({"index": index, "predictions": predictions})
    return {"object": "list", "model": model, "data": data, "usage": pixel_usage(result)}
