"""How an image generator's rows are bucketed, batched and priced: pure and torch-free, the
same for the diffusion handler and the simulated one.

A bucket is the exact size, the batch rounded up to a power of two, the task and how the
images are decoded: `px768x512xb2`; `px512x512xb1~image2image` or `~inpainting` for an
edit (it also encodes its images); `px1024x1024xb1~tiled` for a tiled VAE decode (the
image decoded in tiles, in fewer bytes and more slowly). What follows the first `~` is
the bucket's *variant*: buckets of different variants never price one another (a tiled
1024² costs less than a full 768², which a price kept by size would take for a smaller
image's). Rows that share a task, size, steps, strength, guidance, scheduler, whether
they have a negative prompt, and their decode run as one batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from app.models.image_prompt import ImagePrompt, Task
from app.models.prepared import Bucket, Prepared, next_pow2

TILED = "tiled"
VARIANT_MARK = "~"
_LABEL = re.compile(r"^px(\d+)x(\d+)xb(\d+)(?:~(image2image|inpainting))?(~tiled)?$")

Shape = tuple[Any, ...]  # what rows of one batch share


@dataclass(frozen=True)
class ImageBucket:
    """A bucket's parts: the images' size, the batch it is priced for, its decode."""

    width: int
    height: int
    batch: int
    tiled: bool = False
    task: Task = "text2image"

    @property
    def label(self) -> str:
        task = f"{VARIANT_MARK}{self.task}" if self.task != "text2image" else ""
        tiled = f"{VARIANT_MARK}{TILED}" if self.tiled else ""
        return f"px{self.width}x{self.height}xb{self.batch}{task}{tiled}"

    @property
    def pixels(self) -> int:
        """Pixels the bucket's batch makes: its numeric size."""
        return self.width * self.height * self.batch

    @staticmethod
    def parse(label: str) -> ImageBucket | None:
        found = _LABEL.match(label)
        if found is None:
            return None
        width, height, batch = (int(found.group(i)) for i in (1, 2, 3))
        task: Task = found.group(4) or "text2image"  # type: ignore[assignment]
        return ImageBucket(width, height, batch, found.group(5) is not None, task)


def row_shape(row: ImagePrompt) -> Shape:
    """What rows must share to run as one batch."""
    return (
        row.task,
        row.width,
        row.height,
        row.steps,
        row.strength,
        row.guidance_scale,
        row.scheduler,
        row.negative_prompt is None,
    )


def rows_prepared(rows: list[ImagePrompt], tiled: bool = False) -> Prepared:
    """Rows of one shape (sizes filled in) as one run's input."""
    width, height = rows[0].width or 0, rows[0].height or 0
    bucket = ImageBucket(width, height, next_pow2(len(rows)), tiled, rows[0].task)
    return Prepared(
        Bucket(bucket.label, bucket.pixels),
        rows,
        width * height * len(rows),
        count=len(rows),
        longest=max(width, height),
    )


def is_tiled(prepared: Prepared) -> bool:
    return prepared.bucket.label.endswith(f"{VARIANT_MARK}{TILED}")


def merged(parts: list[Prepared], max_batch: int) -> Prepared | None:
    """Several requests' rows as one run, or None: their shapes or decodes differ, or
    together they are more than `max_batch` rows."""
    if len(parts) == 1:
        return parts[0]
    kinds = {(row_shape(p.payload[0]), is_tiled(p)) for p in parts}
    if len(kinds) != 1 or sum(p.count for p in parts) > max_batch:
        return None
    return rows_prepared([row for p in parts for row in p.payload], is_tiled(parts[0]))


def group_of(prepared: Prepared) -> str:
    """The batch group: requests of one shape and decode wait together."""
    return repr((row_shape(prepared.payload[0]), is_tiled(prepared)))
