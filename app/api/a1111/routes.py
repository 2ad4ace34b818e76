"""AUTOMATIC1111's API (`/sdapi/v1/*`), what Open WebUI, SillyTavern and many plugins
call: txt2img and img2img (with a mask, inpainting) on the served image models under
the same gate as every request, progress with a latent preview, interrupt, the models
(checkpoints), samplers and options (POST `sd_model_checkpoint` chooses the model later
calls go to; a call's `override_settings` may choose its own).

An answer is `{"images": [base64 PNG], "parameters": {the request, defaults filled},
"info": "<JSON string>"}`, and every PNG carries A1111's `parameters` text chunk
("prompt\\nNegative prompt: ...\\nSteps: 20, Sampler: Euler a, CFG scale: 7, Seed: 1,
Size: 512x512, Model: sd15"), which A1111's PNG Info and other tools read back."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from app.api.a1111.jobs import A1111Jobs, caller_of
from app.api.a1111.schemas import (
    ALIASES,
    SAMPLERS,
    Img2ImgRequest,
    Txt2ImgRequest,
    validate_img2img,
    validate_txt2img,
)
from app.api.images.routes import run_images
from app.api.images.uploads import decode_init, decode_mask, from_base64
from app.api.intake import (
    fleet_of,
    read_body,
    read_parsed,
)
from app.core.fleet.fleet import Fleet
from app.core.requests import ValidImageGeneration
from app.core.work import InferenceResult
from app.errors import InvalidJson, InvalidRequest, ModelNotFound

router = APIRouter(prefix="/sdapi/v1", tags=["automatic1111"])
Body = TypeVar("Body", bound=BaseModel)


def _openapi(model: type[BaseModel]) -> dict[str, Any]:
    """The body's schema inline (it is validated here, not by FastAPI)."""
    schema = model.model_json_schema()
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _json(payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json", headers=headers)


def image_models(fleet: Fleet) -> list[str]:
    """The served models that make images, in config order (A1111's checkpoints)."""
    return [name for name in fleet.placement if "image_generation" in fleet.card(name).capabilities]


def checkpoint(fleet: Fleet, jobs: A1111Jobs, asked: str | None) -> str:
    """The model a call goes to: the one it asks for (a title, maybe with A1111's
    ` [hash]` after it), else the chosen checkpoint, else the first image model."""
    served = image_models(fleet)
    name = (asked or jobs.checkpoint or (served[0] if served else "")).split(" [")[0]
    if name not in served:
        known = ", ".join(served) or "none is served"
        raise ModelNotFound(
            f"no image model {name!r} here; the checkpoints are: {known}",
            param="sd_model_checkpoint",
        )
    return name


@router.post(
    "/txt2img", openapi_extra=_openapi(Txt2ImgRequest), summary="AUTOMATIC1111's text to image"
)
async def txt2img(request: Request) -> Response:
    fleet = fleet_of(request)
    jobs: A1111Jobs = request.app.state.a1111
    body = await read_parsed(request, Txt2ImgRequest)
    model = checkpoint(fleet, jobs, body.checkpoint)
    with jobs.job(caller_of(request)) as job:
        valid = validate_txt2img(body, model, fleet.settings, job.progress)
        result = await run_images(request, fleet, valid)
    return _answer(fleet, body, valid, result, model)


@router.post(
    "/img2img",
    openapi_extra=_openapi(Img2ImgRequest),
    summary="AUTOMATIC1111's image to image (with a mask, inpainting)",
)
async def img2img(request: Request) -> Response:
    fleet = fleet_of(request)
    jobs: A1111Jobs = request.app.state.a1111
    settings = fleet.settings
    body = await read_parsed(request, Img2ImgRequest)
    model = checkpoint(fleet, jobs, body.checkpoint)
    init = await decode_init(from_base64(body.init_images[0], "init_images"), settings)
    size = (init.shape[1], init.shape[0])
    mask = None
    if body.mask:
        mask = await decode_mask(from_base64(body.mask, "mask"), size, settings, "a1111")
    with jobs.job(caller_of(request)) as job:
        valid = validate_img2img(body, model, settings, job.progress, init, mask)
        result = await run_images(request, fleet, valid)
    return _answer(fleet, body, valid, result, model, body.denoising_strength)


def _answer(
    fleet: Fleet,
    body: Txt2ImgRequest,
    valid: ValidImageGeneration,
    result: InferenceResult,
    model: str,
    strength: float | None = None,
) -> Response:
    first = valid.first
    seeds = [first.seed + i for i in range(valid.n)]
    texts = [infotext(body, model, seed, strength) for seed in seeds]
    images = [
        base64.b64encode(with_text(png, "parameters", text)).decode("ascii")
        for png, text in zip(result.output, texts, strict=True)
    ]
    parameters = body.model_dump(exclude={"init_images", "mask"})
    info = {
        "prompt": body.prompt,
        "all_prompts": [body.prompt] * valid.n,
        "negative_prompt": body.negative_prompt,
        "all_negative_prompts": [body.negative_prompt] * valid.n,
        "seed": seeds[0],
        "all_seeds": seeds,
        "subseed": -1,
        "all_subseeds": [-1] * valid.n,
        "width": first.width,
        "height": first.height,
        "sampler_name": body.sampler,
        "cfg_scale": body.cfg_scale,
        "steps": body.steps,
        "batch_size": body.batch_size,
        "denoising_strength": strength,
        "sd_model_name": model,
        "infotexts": texts,
        "index_of_first_image": 0,
        "styles": [],
        "clip_skip": 1,
        "restore_faces": False,
        "version": "vramgate",
    }
    if result.warnings:
        info["warnings"] = list(result.warnings)
    payload = {"images": images, "parameters": parameters, "info": orjson.dumps(info).decode()}
    return _json(payload, result.cost.headers())


def infotext(body: Txt2ImgRequest, model: str, seed: int, strength: float | None) -> str:
    """A1111's `parameters` text: the prompt, the negative prompt's line (when there is
    one), then its settings line."""
    settings = [
        f"Steps: {body.steps}",
        f"Sampler: {body.sampler}",
        f"CFG scale: {body.cfg_scale:g}",
        f"Seed: {seed}",
        f"Size: {body.width}x{body.height}",
        f"Model: {model}",
    ]
    if strength is not None:
        settings.append(f"Denoising strength: {strength:g}")
    lines = [body.prompt]
    if body.negative_prompt:
        lines.append(f"Negative prompt: {body.negative_prompt}")
    return "\n".join([*lines, ", ".join(settings)])


def with_text(png: bytes, keyword: str, text: str) -> bytes:
    """The PNG with a text chunk after its header: tEXt when the text is Latin-1, else
    an uncompressed iTXt (UTF-8), as Pillow's `PngInfo.add_text` writes them."""
    try:
        kind, data = b"tEXt", keyword.encode("latin-1") + b"\0" + text.encode("latin-1")
    except UnicodeEncodeError:
        kind, data = b"iTXt", keyword.encode("latin-1") + b"\0\0\0\0\0" + text.encode("utf-8")
    chunk = struct.pack(">I", len(data)) + kind + data
    chunk += struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    end_of_header = 8 + 8 + 13 + 4  # signature, IHDR's length and type, its 13 bytes, CRC
    return png[:end_of_header] + chunk + png[end_of_header:]


@router.get("/progress", summary="AUTOMATIC1111's progress of the current job")
async def progress(request: Request, skip_current_image: bool = False) -> Response:
    jobs: A1111Jobs = request.app.state.a1111
    return _json(jobs.progress(caller_of(request), skip_current_image))


@router.post("/interrupt", summary="Stop the caller's current job at its next step")
async def interrupt(request: Request) -> Response:
    """A1111 answers `{}`; this says too whether a job of the caller's (told apart by
    address) was stopped: another caller's jobs are theirs to stop."""
    jobs: A1111Jobs = request.app.state.a1111
    if jobs.interrupt(caller_of(request)):
        return _json({"interrupted": True, "detail": "your current job stops at its next step"})
    detail = "no job of yours is under way (another caller's jobs are not stopped)"
    return _json({"interrupted": False, "detail": detail})


@router.get("/sd-models", summary="AUTOMATIC1111's checkpoints: the served image models")
async def sd_models(request: Request) -> Response:
    fleet = fleet_of(request)
    rows = []
    for name in image_models(fleet):
        path = fleet.spec(name).path
        rows.append(
            {"title": name, "model_name": name, "hash": None, "sha256": None,
             "filename": str(path) if path is not None else name, "config": None}
        )  # fmt: skip
    return _json(rows)


@router.get("/samplers", summary="AUTOMATIC1111's samplers: our schedulers by A1111's names")
async def samplers() -> Response:
    return _json([{"name": n, "aliases": ALIASES[n], "options": {}} for n in SAMPLERS])


@router.get("/schedulers", summary="AUTOMATIC1111 1.9's schedulers")
async def schedulers() -> Response:
    return _json(
        [
            {"name": "automatic", "label": "Automatic", "aliases": None},
            {"name": "karras", "label": "Karras", "aliases": None},
        ]
    )


@router.get("/options", summary="AUTOMATIC1111's options: the checkpoint calls go to")
async def get_options(request: Request) -> Response:
    fleet = fleet_of(request)
    jobs: A1111Jobs = request.app.state.a1111
    served = image_models(fleet)
    current = jobs.checkpoint or (served[0] if served else None)
    return _json(
        {"sd_model_checkpoint": current, "sd_checkpoint_hash": None, "samples_format": "png",
         "sd_vae": "Automatic", "CLIP_stop_at_last_layers": 1, "eta_noise_seed_delta": 0}
    )  # fmt: skip


@router.post("/options", summary="Choose the checkpoint (other options are ignored)")
async def set_options(request: Request) -> Response:
    fleet = fleet_of(request)
    jobs: A1111Jobs = request.app.state.a1111
    try:
        options = orjson.loads(await read_body(request))
    except orjson.JSONDecodeError:
        raise InvalidJson("the body is not JSON", param="body") from None
    if not isinstance(options, dict):
        raise InvalidRequest("options are a JSON object", param="body")
    asked = options.get("sd_model_checkpoint")
    if asked is not None:
        if not isinstance(asked, str):
            raise InvalidRequest("sd_model_checkpoint is a name", param="sd_model_checkpoint")
        jobs.checkpoint = checkpoint(fleet, jobs, asked)
    return _json(None)
