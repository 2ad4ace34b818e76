"""Text-to-image diffusion models (kind `diffusion`), run with diffusers: Stable Diffusion
1.5 and XL, and whatever `AutoPipelineForText2Image` loads (app.models.diffusion_pipeline).

Each row is one image with its own prompt and seed. Its latents come from a CPU
`torch.Generator` seeded with the row's seed, so a row gives the same pixels as calling
the pipeline directly with `generator=torch.Generator().manual_seed(seed)` (a list of
them for several rows) and the same arguments, on any device.

A row with an init image runs diffusers' image-to-image pipeline over the same loaded
modules (with a mask, its inpainting pipeline; app.models.diffusion_pipeline.for_run),
the image and mask given as PIL images as users give them, so the same seed gives the
same pixels as that pipeline called directly.

Bucket: the exact size and the batch rounded up to a power of two (`px512x512xb2`; an
image-to-image or inpainting run is a variant of its own, `px512x512xb2~image2image`,
since it also encodes its images: app.models.image_buckets' variants never price one
another), priced first by the pipeline's own geometry
(app.models.diffusion_cost), then by its measured peaks. Rows that share a task, size,
steps, strength, guidance, scheduler and whether they have a negative prompt run as one
batch. A run reports each step to its requests' progress (read by /status), with a
latent preview for the requests that asked for one (app.models.diffusion_preview), and
stops early once every client of the batch has left.
"""

from __future__ import annotations

import gc
import re
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from app.engine.device import Device
from app.errors import InvalidImageSize
from app.models.base import Bucket, Prepared, dtype_on, next_pow2
from app.models.diffusion_cost import DiffusionGeometry, image_bytes
from app.models.diffusion_pipeline import for_run, load_pipeline, weights_bytes_on
from app.models.diffusion_preview import latent_previews, table_for
from app.models.image_buckets import VARIANT_MARK
from app.models.image_prompt import ImageProgress, ImagePrompt
from app.models.images import encode_image
from app.models.kinds import ImageGenerator
from app.settings import ModelSpec

LABEL = re.compile(r"^px(\d+)x(\d+)xb(\d+)(?:~(image2image|inpainting))?$")
Shape = tuple[Any, ...]  # what rows of one batch share
# How often a run maps its latents to RGB for the dashboard when no request asked for
# previews: a copy of the latents off the device each time, so not every step.
PREVIEW_EVERY_S = 0.5


class DiffusionHandler(ImageGenerator):
    kind = "diffusion"
    postprocess_on_loop = False  # encoding images stays off the event loop
    preprocess_on_loop = False  # its rows are no texts the loop's shortcut could measure

    def __init__(self, spec: ModelSpec, max_side: int = 4096, max_pixels: int = 2**24) -> None:
        super().__init__(spec)
        assert spec.path is not None, "ModelSpec checks that a diffusion model has a path"
        self.path = Path(spec.path)
        self.max_side, self.max_pixels = max_side, max_pixels
        self._pipeline: Any = None
        self._device = torch.device("cpu")
        self._geometry: DiffusionGeometry | None = None
        self._lock = threading.Lock()  # guards _preview (written by inference threads)
        self._preview: np.ndarray | None = None  # a running batch's latest, for the dashboard

    def expected_weights_bytes(self, device: Device) -> int:
        dtype = getattr(torch, dtype_on(device, self.spec.dtype))
        return weights_bytes_on(self.path, torch.finfo(dtype).bits // 8)

    def load(self, device: Device) -> None:
        self.dtype = dtype_on(device, self.spec.dtype)
        dtype = getattr(torch, self.dtype)
        pipeline = load_pipeline(self.path, dtype, self.spec.pipeline_config)
        self._pipeline = pipeline.to(device.torch_device)
        self._device = device.torch_device
        scale = int(getattr(pipeline, "vae_scale_factor", 8))
        self.grid = max(8, scale)
        unet = getattr(pipeline, "unet", None)
        side = int(unet.config.sample_size) if unet is not None else 64
        self.default_size = (side * scale, side * scale)
        vae = pipeline.vae.config
        self._geometry = DiffusionGeometry.from_configs(
            dict(unet.config) if unet is not None else {},
            dict(vae),
            scale,
            torch.finfo(dtype).bits // 8,
            vae_upcast=bool(vae.get("force_upcast")) and dtype == torch.float16,
        )

    def weights_bytes(self) -> int:
        if self._pipeline is None:
            return 0
        modules = [m for m in self._pipeline.components.values() if isinstance(m, torch.nn.Module)]
        tensors = [t for m in modules for t in (*m.parameters(), *m.buffers())]
        return sum(t.numel() * t.element_size() for t in tensors)

    def unload(self) -> None:
        self._pipeline = None
        gc.collect()

    # -- rows and buckets --------------------------------------------------------------
    def preprocess(self, inputs: list[ImagePrompt]) -> Prepared:
        width, height = self.default_size
        rows = [
            replace(row, width=row.width or width, height=row.height or height) for row in inputs
        ]
        first = rows[0]
        assert first.width is not None and first.height is not None
        self._check_size(first.width, first.height)
        assert all(_shape(row) == _shape(first) for row in rows), "a request's rows share one"
        return self._prepared(rows)

    def _check_size(self, width: int, height: int) -> None:
        refused = self.size_refused(width, height)
        if refused is not None:
            raise refused
        if max(width, height) > self.max_side or width * height > self.max_pixels:
            raise InvalidImageSize(
                f"{width}x{height} is beyond this server's bounds: at most {self.max_side} "
                f"pixels a side and {self.max_pixels} pixels",
                param="size",
            )

    def _prepared(self, rows: list[ImagePrompt]) -> Prepared:
        width, height = rows[0].width or 0, rows[0].height or 0
        batch = next_pow2(len(rows))
        task = rows[0].task
        suffix = "" if task == "text2image" else f"{VARIANT_MARK}{task}"
        return Prepared(
            Bucket(f"px{width}x{height}xb{batch}{suffix}", width * height * batch),
            rows,
            width * height * len(rows),
            count=len(rows),
            longest=max(width, height),
        )

    def merge(self, parts: list[Prepared]) -> Prepared | None:
        if len(parts) == 1:
            return parts[0]
        shapes = {_shape(p.payload[0]) for p in parts}
        if len(shapes) != 1 or sum(p.count for p in parts) > self.spec.max_batch:
            return None
        return self._prepared([row for p in parts for row in p.payload])

    def batch_group(self, prepared: Prepared) -> str:
        return repr(_shape(prepared.payload[0]))

    def leaner(self, prepared: Prepared) -> Prepared | None:
        """None: this handler decodes its images whole, so it offers no tiled run (a
        `~tiled` bucket priced here would be admitted for less than it takes)."""
        return None

    def prior_bytes(self, bucket: Bucket) -> int:
        found = LABEL.match(bucket.label)
        if found is None or self._geometry is None:
            return 0
        width, height, batch = (int(group) for group in found.groups()[:3])
        return image_bytes(self._geometry, width, height, batch)

    # -- running -----------------------------------------------------------------------
    def forward(self, prepared: Prepared) -> Any:
        self.forward_calls += 1
        rows: list[ImagePrompt] = prepared.payload
        try:
            with self.batch_running(prepared) as progresses:  # listed in /status meanwhile
                images = self._run(rows, progresses)
        finally:
            if not self.running():
                with self._lock:
                    self._preview = None
        return [(pixels, row.output_format) for pixels, row in zip(images, rows, strict=True)]

    def _run(self, rows: list[ImagePrompt], progresses: list[ImageProgress]) -> np.ndarray:
        first = rows[0]
        pipeline = for_run(self._pipeline, first.scheduler, first.task)
        table = table_for(type(self._pipeline).__name__)
        shown_at = [-PREVIEW_EVERY_S]  # this run's last preview

        def on_step(pipe: Any, step: int, _: Any, tensors: dict[str, Any]) -> dict[str, Any]:
            self.progress_at = now = time.monotonic()  # each step: the watchdog sees life
            # Previews copy the latents off the device: where a partial image is due, else
            # at the first step and then at most every PREVIEW_EVERY_S (the dashboard's,
            # and A1111's /progress)
            shown = now - shown_at[0] >= PREVIEW_EVERY_S
            due = any(p.due(step + 1, pipe.num_timesteps) for p in progresses)
            wanted = table is not None and (due or shown)
            previews = latent_previews(tensors["latents"], table) if wanted and table else []
            if shown and previews:
                shown_at[0] = now
                with self._lock:
                    self._preview = previews[0]
            owners = [row.progress for row in rows] if previews else []
            for progress in progresses:
                own = [v for v, o in zip(previews, owners, strict=True) if o is progress]
                kept = own if previews and progress.previews else None  # None: keeps its last
                progress.advance(step + 1, pipe.num_timesteps, kept)
            if all(progress.cancelled for progress in progresses):
                pipe._interrupt = True  # diffusers' own stop: the remaining steps are skipped
            return tensors

        arguments = {**_arguments(rows), "callback_on_step_end": on_step}
        with torch.inference_mode():
            images = pipeline(**arguments).images
        return (images * 255).round().astype(np.uint8)  # as diffusers' numpy_to_pil

    def postprocess(self, raw: Any) -> Any:
        return [encode_image(pixels, output_format) for pixels, output_format in raw]

    def prime(self) -> None:
        self.forward(self._prepared(self.probe_input()))
        self.forward_calls = 0

    def preview(self) -> np.ndarray | None:
        """A running batch's latest latent preview (its first row; HWC uint8 RGB, at most
        `PREVIEW_EVERY_S` old while it runs); None when nothing runs."""
        with self._lock:
            return self._preview

    def describe(self) -> dict[str, Any]:
        width, height = self.default_size
        return {
            **super().describe(),
            "path": str(self.path),
            "default_size": f"{width}x{height}",
            "grid": self.grid,
            "pipeline": type(self._pipeline).__name__ if self._pipeline is not None else None,
            "running": self.running(),
        }


def _shape(row: ImagePrompt) -> Shape:
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


def _arguments(rows: list[ImagePrompt]) -> dict[str, Any]:
    """The pipeline's arguments for rows of one shape: each row's prompt and seeded CPU
    generator; its init image and mask as PIL images at the row's size."""
    first = rows[0]
    size = (first.width or 0, first.height or 0)
    arguments: dict[str, Any] = {
        "prompt": [row.prompt for row in rows],
        "negative_prompt": (
            None if first.negative_prompt is None else [r.negative_prompt for r in rows]
        ),
        "generator": [torch.Generator().manual_seed(row.seed) for row in rows],
        "output_type": "np",
    }
    if first.task != "image2image":  # image to image makes its image's own size
        arguments["width"], arguments["height"] = size
    if first.init_image is not None:
        arguments["image"] = [_sized(row.init_image, size) for row in rows]
    if first.mask is not None:
        arguments["mask_image"] = [_sized(row.mask, size) for row in rows]
    if first.strength is not None:
        arguments["strength"] = first.strength
    if first.steps is not None:
        arguments["num_inference_steps"] = first.steps
    if first.guidance_scale is not None:
        arguments["guidance_scale"] = first.guidance_scale
    return arguments


def _sized(pixels: np.ndarray | None, size: tuple[int, int]) -> Image.Image:
    """Pixels (HWC RGB or HW grey) as a PIL image of `size`, resized when they differ."""
    assert pixels is not None, "rows of one shape all have an image, or none"
    image = Image.fromarray(pixels)
    return image if image.size == size else image.resize(size, Image.Resampling.LANCZOS)
