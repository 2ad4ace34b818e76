"""OpenAI's image generation and edit requests (`POST /v1/images/generations`,
`/v1/images/edits`), bounded, and what vramgate does with each of their fields; plus the
extensions local image servers take (`negative_prompt`, `seed`, `steps`,
`guidance_scale`, `scheduler`; for edits `strength`)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.api.openai.fields import FieldSupport, screen_fields
from app.api.openai.schemas import KeepAlive
from app.config.settings import MODEL_NAME_PATTERN, Settings
from app.core.requests import ValidImageGeneration
from app.errors import InvalidImageSize, InvalidRequest
from app.models.image_prompt import SCHEDULERS, ImageProgress, ImagePrompt

MAX_PROMPT_CHARS = 32_000  # gpt-image-1's bound (the text encoder reads 77 tokens of it)
MAX_IMAGES = 10  # OpenAI's bound on n
MAX_STEPS = 150  # AUTOMATIC1111's
MIN_SIDE = 64
SEED_MAX = 2**32 - 1  # AUTOMATIC1111's seeds; row i of a request takes seed + i
SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")
MAX_PARTIAL_IMAGES = 3  # OpenAI's bound
DEFAULT_STEPS = 50  # what SD's and SDXL's pipelines run when no steps are given

# quality → denoising steps; "auto" leaves the pipeline's own default (50 for SD and SDXL)
QUALITY_STEPS: dict[str, int | None] = {
    "low": 15,
    "medium": 25,
    "standard": 25,  # dall-e-3's names
    "high": 40,
    "hd": 40,
    "auto": None,
}


def _done(note: str = "") -> FieldSupport:
    return FieldSupport("implemented", note)


def _ignored(note: str) -> FieldSupport:
    return FieldSupport("ignored", note)


def _refused(note: str, asks_nothing: Callable[[Any], bool] | None = None) -> FieldSupport:
    if asks_nothing is None:
        return FieldSupport("refused", note)
    return FieldSupport("refused", note, asks_nothing)


FIELDS: dict[str, FieldSupport] = {
    "prompt": _done(),
    "model": _done(),
    "n": _done(f"1 to {MAX_IMAGES}, and at most the model's max_batch; row i uses seed + i"),
    "size": _done("WxH, sides multiples of 8 from 64, within max_image_side/pixels; auto"),
    "response_format": _done("b64_json, or url: a link kept for image_url_ttl_s"),
    "output_format": _done("png, jpeg, webp"),
    "quality": _done("low 15 steps, medium 25, high 40, auto the pipeline's default"),
    "background": _refused(
        "the pipelines make opaque images", lambda v: v in (None, "auto", "opaque")
    ),
    "moderation": _ignored("no moderation runs locally"),
    "output_compression": _ignored("JPEG and WebP are written at quality 90"),
    "partial_images": _done(
        f"0 to {MAX_PARTIAL_IMAGES} latent previews (latent2rgb) at evenly spaced steps"
    ),
    "stream": _done("server-sent events: partial images, then each image completed"),
    "style": _ignored("dall-e-3's vivid/natural has no meaning for a local pipeline"),
    "user": _ignored("no per-user accounting"),
    "negative_prompt": _done("extension"),
    "seed": _done("extension: 0 to 2^32-1 (absent: a random one, returned per image)"),
    "steps": _done(f"extension: 1 to {MAX_STEPS}, over quality"),
    "guidance_scale": _done("extension: 0 to 30 (absent: the pipeline's default)"),
    "scheduler": _done(f"extension: one of {', '.join(SCHEDULERS)}"),
    "keep_alive": _done(),
}


class ImageGenerationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    model: str = Field(max_length=64, pattern=MODEL_NAME_PATTERN)
    n: int = Field(default=1, ge=1, le=MAX_IMAGES)
    size: str = Field(default="auto", max_length=16)
    response_format: Literal["b64_json", "url"] = "b64_json"
    stream: bool = False
    partial_images: int = Field(default=0, ge=0, le=MAX_PARTIAL_IMAGES)
    output_format: Literal["png", "jpeg", "webp"] = "png"
    quality: Literal["low", "medium", "high", "auto", "standard", "hd"] = "auto"
    negative_prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    seed: int | None = Field(default=None, ge=0, le=SEED_MAX)
    steps: int | None = Field(default=None, ge=1, le=MAX_STEPS)
    guidance_scale: float | None = Field(default=None, ge=0, le=30)
    scheduler: str | None = Field(default=None, max_length=32)
    keep_alive: KeepAlive = None

    @model_validator(mode="before")
    @classmethod
    def screen_fields(cls, data: Any) -> Any:
        return screen_fields(FIELDS, data)

    @field_validator("prompt")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the prompt is blank")
        return value

    @field_validator("scheduler")
    @classmethod
    def _known_scheduler(cls, value: str | None) -> str | None:
        if value is not None and value not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {value!r}; one of {', '.join(SCHEDULERS)}")
        return value


def image_size(size: str, settings: Settings) -> tuple[int, int] | None:
    """(width, height) asked for, checked against the bounds; None: the model's default."""
    if size == "auto":
        return None
    found = SIZE.match(size)
    if found is None:
        raise InvalidImageSize(f"size {size!r} is not WxH (e.g. 512x512) or auto", param="size")
    width, height = int(found.group(1)), int(found.group(2))
    if min(width, height) < MIN_SIDE or width % 8 or height % 8:
        raise InvalidImageSize(
            f"size {size}: each side a multiple of 8, at least {MIN_SIDE}", param="size"
        )
    if max(width, height) > settings.max_image_side or width * height > settings.max_image_pixels:
        raise InvalidImageSize(
            f"size {size} is beyond this server's bounds: at most {settings.max_image_side} "
            f"pixels a side and {settings.max_image_pixels} pixels (max_image_side, "
            "max_image_pixels)",
            param="size",
        )
    return width, height


def validate_image_generation(
    body: ImageGenerationRequest, settings: Settings
) -> ValidImageGeneration:
    size = image_size(body.size, settings)
    width, height = size if size is not None else (None, None)
    return ValidImageGeneration(
        body.model, _first(body, width, height), body.n, keep_alive=body.keep_alive
    )


def _first(body: ImageGenerationRequest, width: int | None, height: int | None) -> ImagePrompt:
    """Row 0 of a request, whose progress keeps the previews a stream asks for."""
    partials = body.partial_images if body.stream else 0
    return ImagePrompt(
        prompt=body.prompt,
        seed=body.seed if body.seed is not None else secrets.randbelow(SEED_MAX + 1),
        width=width,
        height=height,
        steps=body.steps if body.steps is not None else QUALITY_STEPS[body.quality],
        guidance_scale=body.guidance_scale,
        negative_prompt=body.negative_prompt,
        scheduler=body.scheduler,
        output_format=body.output_format,
        progress=ImageProgress(partial_images=partials),
    )


EDIT_FIELDS: dict[str, FieldSupport] = {
    **FIELDS,
    "image": _done("one image (a format Pillow reads, within max_image_side/pixels)"),
    "mask": _done("a PNG whose transparent parts are repainted (no alpha: white repaints)"),
    "input_fidelity": _ignored("the init image is followed as `strength` says"),
    "strength": _done("extension: how far from the image, 0 (exclusive) to 1"),
}


class ImageEditRequest(ImageGenerationRequest):
    """An edit's form fields besides its files (`image`, `mask`), which come as strings
    and are converted as JSON's would be."""

    strength: float | None = Field(default=None, gt=0, le=1)

    @model_validator(mode="before")
    @classmethod
    def screen_fields(cls, data: Any) -> Any:
        return screen_fields(EDIT_FIELDS, data)


def edit_size(
    body: ImageEditRequest, image: tuple[int, int], settings: Settings
) -> tuple[int, int]:
    """The size an edit makes: the asked one, or (auto) the image's own, its sides cut
    down to multiples of 8."""
    asked = image_size(body.size, settings)
    if asked is not None:
        return asked
    width, height = (side - side % 8 for side in image)
    return image_size(f"{width}x{height}", settings) or (width, height)


def validate_image_edit(
    body: ImageEditRequest,
    init: np.ndarray,
    mask: np.ndarray | None,
    settings: Settings,
) -> ValidImageGeneration:
    """An edit of `init` (HWC RGB), repainting where `mask` (HW, 255) says."""
    width, height = edit_size(body, (init.shape[1], init.shape[0]), settings)
    first = replace(_first(body, width, height), init_image=init, mask=mask, strength=body.strength)
    check_strength(first.steps, first.strength, "strength")
    return ValidImageGeneration(body.model, first, body.n, keep_alive=body.keep_alive)


def check_strength(steps: int | None, strength: float | None, param: str) -> None:
    """An image-to-image run denoises int(steps x strength) steps: at least one."""
    if strength is not None and int((steps or DEFAULT_STEPS) * strength) < 1:
        raise InvalidRequest(
            f"{param} {strength:g} of {steps or DEFAULT_STEPS} steps leaves no step to run; "
            "raise the strength or the steps",
            param=param,
        )
