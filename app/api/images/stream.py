"""`stream: true` for image generations and edits: server-sent events in OpenAI's shape.
`<kind>.partial_image` carries a latent preview (app.engines.torch.diffusion.preview, scaled to
the image's size) as it is kept along the run (`partial_images`, at most 3; fewer when
the run has fewer steps), then `<kind>.completed` carries each finished image. Errors
after the events began come as one `error` event; what can be checked before is checked
before the events begin (`refusal`: the model, its kind, n against its max_batch), so
bad input is still a 400 or 404.

The stream owns its run: a client that leaves ends the stream (Starlette stops it on
the disconnect), and its `finally` cancels the request's rows and its place in line."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
from fastapi.responses import StreamingResponse
from PIL import Image

from app.api.intake import (
    pixel_usage,
)
from app.core.fleet.fleet import Fleet
from app.core.requests import ValidImageGeneration
from app.core.watch import ClientWatch
from app.errors import InvalidRequest, VramgateError, WrongModelKind
from app.models.images import encode_image

POLL_S = 0.05  # how often the stream looks for a new partial image while the run goes on


def event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def shown(preview: np.ndarray, width: int, height: int, output_format: str) -> str:
    """A latent preview scaled (nearest) to the image's size, encoded, in base64."""
    image = Image.fromarray(preview).resize((width, height), Image.Resampling.NEAREST)
    return base64.b64encode(encode_image(np.asarray(image), output_format)).decode("ascii")


def refusal(fleet: Fleet, valid: ValidImageGeneration) -> VramgateError | None:
    """Why a request cannot run, as far as its model's card and spec tell (the core
    checks the same once it runs; a stream's status line is sent before that)."""
    capabilities = fleet.card(valid.model).capabilities  # 404 for a model not served
    if "image_generation" not in capabilities:
        return WrongModelKind(f"model {valid.model!r} does not make images", param="model")
    most = fleet.spec(valid.model).max_batch
    if valid.n > most:
        return InvalidRequest(
            f"model {valid.model!r} makes at most {most} images at once (its max_batch); "
            f"n={valid.n}",
            param="n",
        )
    return None


def stream_images(
    fleet: Fleet, valid: ValidImageGeneration, size: tuple[int, int], kind: str, quality: str
) -> StreamingResponse:
    """The events of one request's run; `kind` is image_generation or image_edit."""
    refused = refusal(fleet, valid)
    if refused is not None:
        raise refused
    first = valid.first
    width, height = size
    common = {
        "size": f"{width}x{height}",
        "quality": quality,
        "background": "opaque",
        "output_format": first.output_format,
    }

    def partial(preview: np.ndarray, index: int) -> bytes:
        b64 = shown(preview, width, height, first.output_format)
        return event(
            f"{kind}.partial_image",
            {"type": f"{kind}.partial_image", "b64_json": b64, "created_at": int(time.time()),
             **common, "partial_image_index": index},
        )  # fmt: skip

    async def events() -> AsyncIterator[bytes]:
        run = asyncio.ensure_future(fleet.run(valid, ClientWatch(None)))
        sent = 0
        try:
            while True:
                await asyncio.wait({run}, timeout=POLL_S)
                for previews in first.progress.partials(sent):
                    for preview in previews:
                        yield await asyncio.to_thread(partial, preview, sent)
                    sent += 1
                if run.done():
                    break
            result = run.result()
            spent = {
                "input_tokens": 0,
                "input_tokens_details": {"image_tokens": 0, "text_tokens": 0},
                "output_tokens": 0,
                "total_tokens": 0,
                **pixel_usage(result),
            }
            for i, image in enumerate(result.output):
                data = {"type": f"{kind}.completed",
                        "b64_json": base64.b64encode(image).decode("ascii"),
                        "created_at": int(time.time()), **common, "usage": spent,
                        "seed": first.seed + i}  # fmt: skip
                yield event(f"{kind}.completed", data)
        except VramgateError as exc:
            yield event("error", {"type": "error", **exc.body()})
        finally:
            if not run.done():
                first.progress.cancel()  # its client left: its rows stop, its place goes
                run.cancel()

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
