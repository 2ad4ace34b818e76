"""AUTOMATIC1111's `/sdapi/v1/txt2img` and `/img2img` bodies, bounded, and what they
become: one `ValidImageGeneration` (image i uses seed + i, as A1111's batch does).

A1111's clients send many fields (Open WebUI a few, SillyTavern and plugins dozens):
unknown ones are accepted and ignored, as A1111's own API does. The ones that ask for
what vramgate does not do (hires fix, tiling, face restoration, scripts) are refused
when they ask for it; bad values are a 400 with our error codes, before queueing.

Samplers are A1111's names for our schedulers (`SAMPLERS`); A1111 1.9's separate
`scheduler: "Karras"` picks a sampler's Karras variant."""

from __future__ import annotations

import secrets
from dataclasses import replace
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.api.images.schemas import (
    MAX_IMAGES,
    MAX_PROMPT_CHARS,
    MAX_STEPS,
    SEED_MAX,
    check_strength,
    image_size,
)
from app.config.settings import Settings
from app.core.requests import ValidImageGeneration
from app.errors import InvalidRequest
from app.models.image_prompt import ImageProgress, ImagePrompt

# A1111's sampler name → our scheduler (app.models.image_prompt.SCHEDULERS)
SAMPLERS: dict[str, str] = {
    "Euler a": "euler_a",
    "Euler": "euler",
    "LMS": "lms",
    "Heun": "heun",
    "DPM++ 2M": "dpm++_2m",
    "DPM++ 2M Karras": "dpm++_2m_karras",
    "DDIM": "ddim",
    "PLMS": "pndm",
    "UniPC": "unipc",
}
ALIASES: dict[str, list[str]] = {
    "Euler a": ["k_euler_a", "k_euler_ancestral"],
    "Euler": ["k_euler"],
    "LMS": ["k_lms"],
    "Heun": ["k_heun"],
    "DPM++ 2M": ["k_dpmpp_2m"],
    "DPM++ 2M Karras": ["k_dpmpp_2m_ka"],
    "DDIM": ["ddim"],
    "PLMS": ["plms"],
    "UniPC": ["unipc"],
}
DEFAULT_SAMPLER = "Euler a"
# fields that ask for something vramgate does not do, refused unless they ask nothing
REFUSED: dict[str, str] = {
    "enable_hr": "hires fix is not implemented",
    "tiling": "tiling (seamless textures) is not implemented",
    "restore_faces": "face restoration is not implemented",
    "script_name": "scripts are not implemented",
    "alwayson_scripts": "scripts (ControlNet, ADetailer...) are not implemented",
    "refiner_checkpoint": "a refiner is not implemented",
}


def sampler_of(name: str | None, scheduler: str | None) -> str:
    """The A1111 sampler name for a request's `sampler_name` (its name or an alias) and
    A1111 1.9's `scheduler` (Automatic, or Karras for a Karras variant)."""
    name = name or DEFAULT_SAMPLER
    by_alias = {alias: sampler for sampler, aliases in ALIASES.items() for alias in aliases}
    name = by_alias.get(name, name)
    if scheduler and scheduler.lower() == "karras" and not name.endswith("Karras"):
        name = f"{name} Karras"
    elif scheduler and scheduler.lower() not in ("automatic", "karras"):
        raise InvalidRequest(
            f"unknown scheduler {scheduler!r}; Automatic or Karras", param="scheduler"
        )
    if name not in SAMPLERS:
        raise InvalidRequest(
            f"unknown sampler {name!r}; one of {', '.join(SAMPLERS)}", param="sampler_name"
        )
    return name


class Txt2ImgRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    prompt: str = Field(default="", max_length=MAX_PROMPT_CHARS)
    negative_prompt: str = Field(default="", max_length=MAX_PROMPT_CHARS)
    seed: int = Field(default=-1, ge=-1, le=SEED_MAX)
    sampler_name: str | None = Field(default=None, max_length=64)
    sampler_index: str | None = Field(default=None, max_length=64)  # the older name of it
    scheduler: str | None = Field(default=None, max_length=32)
    batch_size: int = Field(default=1, ge=1, le=MAX_IMAGES)
    n_iter: int = Field(default=1, ge=1, le=MAX_IMAGES)
    steps: int = Field(default=50, ge=1, le=MAX_STEPS)
    cfg_scale: float = Field(default=7.0, ge=0, le=30)
    width: int = Field(default=512, ge=1, le=16384)
    height: int = Field(default=512, ge=1, le=16384)
    override_settings: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, why in REFUSED.items():
                if data.get(name) not in (None, False, 0, "", "None", [], {}):
                    raise InvalidRequest(f"{name} is not supported: {why}", param=name)
        return data

    @model_validator(mode="after")
    def _batch(self) -> Txt2ImgRequest:
        if self.batch_size * self.n_iter > MAX_IMAGES:
            raise ValueError(f"batch_size x n_iter makes at most {MAX_IMAGES} images")
        return self

    @property
    def sampler(self) -> str:
        return sampler_of(self.sampler_name or self.sampler_index, self.scheduler)

    @property
    def checkpoint(self) -> str | None:
        """The checkpoint this call asks for (`override_settings`), else None."""
        found = self.override_settings.get("sd_model_checkpoint")
        return found if isinstance(found, str) and found else None


class Img2ImgRequest(Txt2ImgRequest):
    init_images: list[str] = Field(min_length=1, max_length=1)  # base64 (data URL or bare)
    denoising_strength: float = Field(default=0.75, gt=0, le=1)
    mask: str | None = None
    inpainting_mask_invert: int = Field(default=0, ge=0, le=1)


def validate_txt2img(
    body: Txt2ImgRequest, model: str, settings: Settings, progress: ImageProgress
) -> ValidImageGeneration:
    width, height = image_size(f"{body.width}x{body.height}", settings) or (0, 0)
    first = ImagePrompt(
        prompt=body.prompt,
        seed=body.seed if body.seed >= 0 else secrets.randbelow(SEED_MAX + 1),
        width=width,
        height=height,
        steps=body.steps,
        guidance_scale=body.cfg_scale,
        negative_prompt=body.negative_prompt or None,
        scheduler=SAMPLERS[body.sampler],
        progress=progress,
    )
    return ValidImageGeneration(model, first, body.batch_size * body.n_iter)


def validate_img2img(
    body: Img2ImgRequest,
    model: str,
    settings: Settings,
    progress: ImageProgress,
    init: np.ndarray,
    mask: np.ndarray | None,
) -> ValidImageGeneration:
    valid = validate_txt2img(body, model, settings, progress)
    if mask is not None and body.inpainting_mask_invert:
        mask = 255 - mask
    strength = body.denoising_strength
    check_strength(body.steps, strength, "denoising_strength")
    first = replace(valid.first, init_image=init, mask=mask, strength=strength)
    return replace(valid, first=first)
