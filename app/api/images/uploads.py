"""The images an edit starts from, decoded and bounded before anything is queued (the
checks of app.models.images: a format Pillow reads, `max_image_side` and
`max_image_pixels`, no decompression bomb, nothing truncated), and its mask.

A mask says where to repaint. OpenAI's convention: the transparent parts of a PNG with
an alpha channel (alpha 0: repaint). AUTOMATIC1111's: where a mask with alpha is opaque
(alpha over 128). Without alpha, both as diffusers': white repaints, black keeps. It
must be the image's size."""

from __future__ import annotations

import asyncio
import base64
import binascii
import io

import numpy as np
from PIL import Image

from app.config.settings import Settings
from app.errors import InvalidImage, InvalidRequest
from app.models.images import decode_rgb, image_size


def from_base64(text: str, param: str) -> bytes:
    """An image's bytes from base64, with or without a `data:image/...;base64,` prefix
    (AUTOMATIC1111's clients send both)."""
    if text.startswith("data:"):
        text = text.partition(",")[2]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{param} is not valid base64", param=param) from None


async def decode_init(data: bytes, settings: Settings) -> np.ndarray:
    """HWC uint8 RGB pixels, bounded; decoded off the event loop."""
    return await asyncio.to_thread(
        decode_rgb, data, settings.max_image_side, settings.max_image_pixels
    )


async def decode_mask(
    data: bytes, size: tuple[int, int], settings: Settings, convention: str = "openai"
) -> np.ndarray:
    """HW uint8, 255 where to repaint; `size` is the image's (width, height);
    `convention`: openai or a1111 (what an alpha channel means)."""
    return await asyncio.to_thread(_mask, data, size, settings, convention)


def _mask(data: bytes, size: tuple[int, int], settings: Settings, convention: str) -> np.ndarray:
    try:
        found = image_size(data, settings.max_image_side, settings.max_image_pixels)
    except InvalidRequest as exc:
        raise type(exc)(exc.message.replace("the image", "the mask"), param="mask") from None
    if found != size:
        raise InvalidImage(
            f"the mask is {found[0]}x{found[1]}; it must be the image's size, {size[0]}x{size[1]}",
            param="mask",
        )
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            if "A" in image.getbands() or "transparency" in image.info:
                alpha = np.array(image.convert("RGBA"))[:, :, 3]
                if convention == "openai":
                    return np.where(alpha == 0, 255, 0).astype(np.uint8)
                if alpha.min() < 255:  # A1111 reads a mask's alpha only when it has some
                    return np.where(alpha > 128, 255, 0).astype(np.uint8)
            return np.array(image.convert("L"))
    except Exception:
        raise InvalidImage("the mask is truncated or corrupt", param="mask") from None
