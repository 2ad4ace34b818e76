"""Generated images asked for as links (`response_format: "url"`): kept in memory for
`image_url_ttl_s`, the newest `MAX_FILES` and `MAX_BYTES` at most, and served at
`GET /v1/images/files/{id}`. An id is 128 random bits, so a link is its own capability;
past its time (or pushed out by newer images) it is a 404 `image_expired`."""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from fastapi.responses import Response

from app.errors import ImageExpired

MAX_FILES = 256
MAX_BYTES = 512 * 2**20
MEDIA_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}

router = APIRouter(prefix="/v1", tags=["images"])


@dataclass(frozen=True)
class KeptImage:
    data: bytes
    media_type: str
    expires: float  # on the store's clock


class ImageFiles:
    """The kept images, oldest first. Used on the event loop only: no lock."""

    def __init__(
        self,
        ttl_s: float,
        max_files: int = MAX_FILES,
        max_bytes: int = MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s, self.max_files, self.max_bytes = ttl_s, max_files, max_bytes
        self._clock = clock
        self._kept: OrderedDict[str, KeptImage] = OrderedDict()
        self._bytes = 0

    def put(self, data: bytes, output_format: str) -> str:
        """Keep an encoded image; its id (the last part of its link)."""
        now = self._clock()
        self._drop(lambda: self._kept[next(iter(self._kept))].expires <= now)  # expired
        key = secrets.token_urlsafe(16)
        self._kept[key] = KeptImage(data, MEDIA_TYPES[output_format], now + self.ttl_s)
        self._bytes += len(data)
        self._drop(lambda: len(self._kept) > self.max_files or self._bytes > self.max_bytes)
        return key

    def get(self, key: str) -> KeptImage | None:
        now = self._clock()
        self._drop(lambda: self._kept[next(iter(self._kept))].expires <= now)
        return self._kept.get(key)

    def _drop(self, while_true: Callable[[], bool]) -> None:
        """Drop the oldest while the condition holds (they expire in the order kept)."""
        while self._kept and while_true():
            _, gone = self._kept.popitem(last=False)
            self._bytes -= len(gone.data)


@router.get("/images/files/{key}", summary="A generated image kept for a while (url answers)")
async def image_file(
    request: Request, key: str = PathParam(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
) -> Response:
    files: ImageFiles = request.app.state.image_files
    kept = files.get(key)
    if kept is None:
        raise ImageExpired(
            f"image {key!r} is not kept here: links last {files.ttl_s:g} s "
            "(image_url_ttl_s), and only the newest images are kept",
            param="key",
        )
    headers = {"Cache-Control": "private, max-age=60", "X-Content-Type-Options": "nosniff"}
    return Response(kept.data, media_type=kept.media_type, headers=headers)
