"""Image generation: `POST /v1/images/generations` in OpenAI's shape (app.api.images_schemas:
its fields and extensions). The answer is `{"created", "data": [{"b64_json", "seed"}],
"output_format", "size", "usage"}` with vramgate's cost headers; the images are encoded
in `output_format`. A client that leaves stops its images at the next denoising step."""

from __future__ import annotations

import base64
import time
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from app.api.errors import from_validation_errors
from app.api.images_schemas import ImageGenerationRequest, validate_image_generation
from app.api.openai_routes import client_watch, read_body
from app.api.vision_routes import usage
from app.core.fleet import Fleet
from app.models.kinds import ImageGenerator

router = APIRouter(prefix="/v1", tags=["images"])

# The body is validated here, not by FastAPI: its schema goes inline (it nests no models)
OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": ImageGenerationRequest.model_json_schema()}},
    }
}


@router.post("/images/generations", openapi_extra=OPENAPI, summary="Generate images from a prompt")
async def generate_images(request: Request) -> Response:
    fleet: Fleet = request.app.state.fleet
    try:
        body = ImageGenerationRequest.model_validate_json(await read_body(request))
    except ValidationError as exc:
        raise from_validation_errors(exc.errors()) from None
    valid = validate_image_generation(body, fleet.settings)
    with client_watch(request) as watch:
        try:
            result = await fleet.run(valid, watch)
        except BaseException:
            valid.first.progress.cancel()  # its client left, or it failed: its rows stop
            raise
    width, height = valid.first.width, valid.first.height
    if width is None or height is None:
        width, height = fleet.handler(valid.model, ImageGenerator).default_size
    data = [
        {"b64_json": base64.b64encode(image).decode("ascii"), "seed": valid.first.seed + i}
        for i, image in enumerate(result.output)
    ]
    payload: dict[str, Any] = {
        "created": int(time.time()),
        "data": data,
        "output_format": valid.first.output_format,
        "size": f"{width}x{height}",
        "usage": usage(result),
    }
    return Response(
        orjson.dumps(payload), media_type="application/json", headers=result.cost.headers()
    )
