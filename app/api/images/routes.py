"""Image generation: `POST /v1/images/generations` and `POST /v1/images/edits` in OpenAI's
shape (app.api.images.schemas: their fields and extensions). The answer is `{"created",
"data": [{"b64_json" or "url", "seed"}], "output_format", "size", "usage"}` with
vramgate's cost headers; the images are encoded in `output_format`; a `url` is served
by vramgate for `image_url_ttl_s` (app.api.images.files); `stream: true` answers with
server-sent events (app.api.images.stream). A client that leaves stops its images at
the next denoising step.

An edit is multipart (`image`, optional `mask`, and the generation's fields as form
fields): image to image, or with a mask inpainting, on the same served pipeline.

`GET /v1/images/preview/{model}`: the latent preview of the model's running batch (a
PNG at the latents' size), 204 when nothing runs; the dashboard shows it."""

from __future__ import annotations

import base64
import time
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from fastapi.responses import Response
from pydantic import ValidationError

from app.api.errors import from_validation_errors
from app.api.images.files import ImageFiles
from app.api.images.schemas import (
    ImageEditRequest,
    ImageGenerationRequest,
    validate_image_edit,
    validate_image_generation,
)
from app.api.images.stream import stream_images
from app.api.images.uploads import decode_init, decode_mask
from app.api.intake import (
    client_watch,
    fleet_of,
    pixel_usage,
    read_parsed,
)
from app.config.settings import MODEL_NAME_PATTERN
from app.core.fleet.fleet import Fleet
from app.core.requests import ValidImageGeneration
from app.core.work import InferenceResult
from app.errors import InvalidRequest, WrongModelKind
from app.models.images import encode_png
from app.models.kinds import LACKING, ImageGenerator, kind_phrase

router = APIRouter(prefix="/v1", tags=["images"])

# The body is validated here, not by FastAPI: its schema goes inline (it nests no models)
OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": ImageGenerationRequest.model_json_schema()}},
    }
}
EDIT_SCHEMA = ImageEditRequest.model_json_schema()
EDIT_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    **EDIT_SCHEMA,
                    "required": ["image", "prompt", "model"],
                    "properties": {
                        "image": {"type": "string", "format": "binary"},
                        "mask": {"type": "string", "format": "binary"},
                        **EDIT_SCHEMA["properties"],
                    },
                }
            }
        },
    }
}
FILE_FIELDS = ("image", "image[]", "mask")


@router.post("/images/generations", openapi_extra=OPENAPI, summary="Generate images from a prompt")
async def generate_images(request: Request) -> Response:
    fleet = fleet_of(request)
    body = await read_parsed(request, ImageGenerationRequest)
    valid = validate_image_generation(body, fleet.settings)
    return await answer(request, valid, body, "image_generation")


@router.post("/images/edits", openapi_extra=EDIT_OPENAPI, summary="Edit or inpaint an image")
async def edit_images(request: Request) -> Response:
    fleet = fleet_of(request)
    settings = fleet.settings
    form = await request.form(max_files=len(FILE_FIELDS), max_fields=48)
    try:
        images = [f for name in ("image", "image[]") for f in form.getlist(name)]
        files = [f for f in images if not isinstance(f, str)]
        if len(files) != 1 or len(images) != 1:
            raise InvalidRequest(
                f"send one image file (the `image` field); got {len(images)}", param="image"
            )
        init_bytes = await files[0].read()
        mask_file = form.get("mask")
        mask_bytes = (
            None if mask_file is None or isinstance(mask_file, str) else await mask_file.read()
        )
        fields = {k: v for k, v in form.multi_items() if k not in FILE_FIELDS}
    finally:
        await form.close()
    try:
        body = ImageEditRequest.model_validate(fields)
    except ValidationError as exc:
        raise from_validation_errors(exc.errors()) from None
    init = await decode_init(init_bytes, settings)
    size = (init.shape[1], init.shape[0])
    mask = None if mask_bytes is None else await decode_mask(mask_bytes, size, settings)
    valid = validate_image_edit(body, init, mask, settings)
    return await answer(request, valid, body, "image_edit")


async def answer(
    request: Request, valid: ValidImageGeneration, body: ImageGenerationRequest, kind: str
) -> Response:
    fleet = fleet_of(request)
    width, height = valid.first.width, valid.first.height
    if width is None or height is None:
        card = fleet.card(valid.model)  # 404 for a model not served
        if card.image_size is None:  # no image generator: refused before anything runs
            raise WrongModelKind(
                f"model {valid.model!r} is {kind_phrase(card.kind)}: {LACKING[ImageGenerator]}",
                param="model",
            )
        width, height = card.image_size
    if body.stream:
        return stream_images(fleet, valid, (width, height), kind, body.quality)
    result = await run_images(request, fleet, valid)
    files: ImageFiles = request.app.state.image_files
    data = []
    for i, image in enumerate(result.output):
        item: dict[str, Any] = {"seed": valid.first.seed + i}
        if body.response_format == "url":
            key = files.put(image, valid.first.output_format)
            item["url"] = str(request.url_for("image_file", key=key))
        else:
            item["b64_json"] = base64.b64encode(image).decode("ascii")
        data.append(item)
    payload: dict[str, Any] = {
        "created": int(time.time()),
        "data": data,
        "output_format": valid.first.output_format,
        "size": f"{width}x{height}",
        "usage": pixel_usage(result),
    }
    if result.warnings:
        payload["warnings"] = list(result.warnings)
    return Response(
        orjson.dumps(payload), media_type="application/json", headers=result.cost.headers()
    )


async def run_images(
    request: Request, fleet: Fleet, valid: ValidImageGeneration
) -> InferenceResult:
    """The request's images, under the gate; its rows stop if its client leaves."""
    with client_watch(request) as watch:
        try:
            return await fleet.run(valid, watch)
        except BaseException:
            valid.first.progress.cancel()  # its client left, or it failed: its rows stop
            raise


@router.get("/images/preview/{model}", summary="The running image's latent preview (PNG)")
async def running_preview(
    request: Request, model: str = PathParam(max_length=64, pattern=MODEL_NAME_PATTERN)
) -> Response:
    fleet = fleet_of(request)
    pixels = fleet.preview(model)
    if pixels is None:
        return Response(status_code=204, headers={"Cache-Control": "no-store"})
    headers = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
    return Response(encode_png(pixels), media_type="image/png", headers=headers)
