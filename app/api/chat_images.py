"""Images in chat messages, as each API sends them (OpenAI's `image_url` data URLs,
Ollama's base64 `images`, Anthropic's base64 image blocks): decoded into bytes and
checked (a format Pillow reads, within `max_image_side` and `max_image_pixels`, no
decompression bomb) before anything is queued, reading the header only: the model's
processor decodes the pixels later, on the CPU pool. Images are never fetched from a
URL: a local server that fetches what a prompt names can be made to reach the network.
A model that does not see (no `vision` in its card) is a 400 naming it."""

from __future__ import annotations

import base64
import binascii
import re
from typing import TYPE_CHECKING

from app.config.settings import Settings
from app.errors import ImageTooLarge, InvalidImage, InvalidRequest
from app.models.images import image_size

if TYPE_CHECKING:
    from app.core.fleet.fleet import Fleet

# any media type: the image's own header says what it is
_DATA_URL = re.compile(r"^data:[^,;]*(;[^,;]*)*;base64,", re.IGNORECASE)


def url_image(url: str, settings: Settings, param: str) -> bytes:
    """An image from OpenAI's `image_url.url`: a base64 data URL."""
    if url.lower().startswith(("http://", "https://")):
        raise InvalidRequest(
            "image URLs are not fetched: send the image itself as a data URL "
            "(data:image/png;base64,...)",
            param=param,
        )
    found = _DATA_URL.match(url)
    if found is None:
        raise InvalidImage(
            "an image_url must be a base64 data URL (data:image/png;base64,...)", param=param
        )
    return base64_image(url[found.end() :], settings, param)


def base64_image(text: str, settings: Settings, param: str) -> bytes:
    """An image sent as base64 text, checked."""
    try:
        data = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidImage("the image is not valid base64", param=param) from None
    return checked_image(data, settings, param)


def checked_image(data: bytes, settings: Settings, param: str) -> bytes:
    """`data` if its header says it is an image within the bounds; a 400 that says why
    not (a bomb's header is read, never its pixels)."""
    try:
        image_size(data, settings.max_image_side, settings.max_image_pixels)
    except ImageTooLarge as exc:  # one part of a chat: the request is invalid, not large
        raise InvalidImage(exc.message, param=param) from None
    except InvalidImage as exc:
        raise InvalidImage(exc.message, param=param) from None
    return data


def check_image_count(count: int, settings: Settings, param: str) -> None:
    if count > settings.max_images:
        raise InvalidRequest(
            f"the messages hold {count} images; at most {settings.max_images} are allowed",
            param=param,
        )


def refuse_unseeing(fleet: Fleet, model: str, images: int, param: str) -> None:
    """A 400 naming `model` when a request holds `images` and the model does not see
    (its card, read without loading it; a 404 first for a model not served)."""
    if not images:
        return
    card = fleet.card(model)
    if "vision" in card.capabilities:
        return
    raise InvalidRequest(  # the code Anthropic's route has always given it
        f"model {model!r} cannot see images: it takes text only "
        f"({', '.join(card.capabilities)}); send images to a vision-language model",
        param=param,
    )
