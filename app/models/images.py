"""Image decoding, bounded: dimensions are read from the header and checked against the
settings before a single pixel is decoded, Pillow's own decompression-bomb limit is set
to the same bound (and its warning is an error), and a truncated file is refused."""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageFile

from app.errors import ImageTooLarge, InvalidImage

# Deliberately set: Pillow refuses anything larger even if a caller forgets our check.
MAX_PIXELS_HARD = 64 * 2**20
Image.MAX_IMAGE_PIXELS = MAX_PIXELS_HARD
ImageFile.LOAD_TRUNCATED_IMAGES = False  # the default, stated: a cut file is an error


def image_size(data: bytes, max_side: int, max_pixels: int) -> tuple[int, int]:
    """(width, height) from the header, within bounds; nothing is decoded."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageTooLarge(f"the image is too large to decode: {exc}", param="image") from None
    except Exception:
        raise InvalidImage("the upload is not an image Pillow can read", param="image") from None
    if width > max_side or height > max_side or width * height > max_pixels:
        raise ImageTooLarge(
            f"the image is {width}×{height}; at most {max_side} pixels a side and "
            f"{max_pixels} pixels are accepted",
            param="image",
        )
    return width, height


def decode_rgb(data: bytes, max_side: int, max_pixels: int) -> np.ndarray:
    """HWC uint8 RGB pixels of a bounded, complete image."""
    image_size(data, max_side, max_pixels)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                image.load()
                return np.array(image.convert("RGB"))  # writable, for torch
    except Exception:
        raise InvalidImage("the image is truncated or corrupt", param="image") from None


def encode_png(pixels: np.ndarray) -> bytes:
    """HWC uint8 (RGB or grey) to PNG bytes."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


ENCODED_QUALITY = 90  # JPEG's and WebP's quality (PNG is lossless)


def encode_image(pixels: np.ndarray, output_format: str) -> bytes:
    """HWC uint8 RGB to an encoded image: "png", "jpeg" or "webp"."""
    if output_format == "png":
        return encode_png(pixels)
    buffer = io.BytesIO()
    name = {"jpeg": "JPEG", "webp": "WEBP"}[output_format]
    Image.fromarray(pixels).save(buffer, format=name, quality=ENCODED_QUALITY)
    return buffer.getvalue()
