"""Text-to-image diffusion models (kind `diffusion`), run with diffusers: Stable Diffusion
1.5 and XL, and whatever `AutoPipelineForText2Image` loads (app.engines.torch.diffusion.pipeline).

Each row is one image with its own prompt and seed. Its latents come from a CPU
`torch.Generator` seeded with the row's seed, so a row gives the same pixels as calling
the pipeline directly with `generator=torch.Generator().manual_seed(seed)` (a list of
them for several rows) and the same arguments, on any device.

A row with an init image runs diffusers' image-to-image pipeline over the same loaded
modules (with a mask, its inpainting pipeline; app.engines.torch.diffusion.pipeline.for_run),
the image and mask given as PIL images as users give them, so the same seed gives the
same pixels as that pipeline called directly.

Buckets and batches are every image generator's (app.models.image_buckets: the exact
size and the batch rounded up to a power of two, `px512x512xb2`; an edit's task and a
tiled decode are variants, `px512x512xb2~image2image`, `px1024x1024xb1~tiled`), priced
first by the pipeline's own geometry (app.engines.torch.diffusion.cost), then by its measured
peaks. A tiled run decodes with a copy of the VAE whose tiling is on (the loaded one is
shared by every run), where the server chose it because only that fits
(ImageGenerator.leaner). A run reports each step to its requests' progress (read by /status), with a
latent preview for the requests that asked for one (app.engines.torch.diffusion.preview), and
stops early once every client of the batch has left.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from app.config.settings import ModelSpec
from app.devices.base import Device
from app.devices.torch_backed import torch_device_of
from app.engines.torch.diffusion.cost import DiffusionGeometry, image_bytes
from app.engines.torch.diffusion.pipeline import for_run, load_pipeline, weights_bytes_on
from app.engines.torch.diffusion.preview import latent_previews, table_for
from app.models.base import dtype_on
from app.models.image_buckets import ImageBucket, is_tiled
from app.models.image_prompt import ImageProgress, ImagePrompt
from app.models.images import encode_image
from app.models.kinds import ImageGenerator
from app.models.prepared import Bucket, Prepared
from app.models.stages import InThreads

# How often a run maps its latents to RGB for the dashboard when no request asked for
# previews: a copy of the latents off the device each time, so not every step.
PREVIEW_EVERY_S = 0.5


class DiffusionHandler(InThreads, ImageGenerator):
    kind = "diffusion"
    postprocess_on_loop = False  # encoding images stays off the event loop
    preprocess_on_loop = False  # its rows are no texts the loop's shortcut could measure

    def __init__(self, spec: ModelSpec, max_side: int = 4096, max_pixels: int = 2**24) -> None:
        super().__init__(spec)
        assert spec.path is not None, "ModelSpec checks that a diffusion model has a path"
        self.path = Path(spec.path)
        self.max_side, self.max_pixels = max_side, max_pixels
        self._pipeline: Any = None
        self._tokenizer: Any = None
        self._device = torch.device("cpu")
        self._geometry: DiffusionGeometry | None = None
        self._lock = threading.Lock()  # guards _preview (written by inference threads)
        # held by each run of a model whose pipeline casts its shared VAE in place (see
        # load): two such runs at once would cast it under each other's decode
        self._vae_lock = threading.Lock()
        self.upcasts = False
        self._preview: np.ndarray | None = None  # a running batch's latest, for the dashboard

    def expected_weights_bytes(self, device: Device) -> int:
        dtype = getattr(torch, dtype_on(device, self.spec.dtype))
        return weights_bytes_on(self.path, torch.finfo(dtype).bits // 8)

    def load(self, device: Device) -> None:
        self.dtype = dtype_on(device, self.spec.dtype)
        dtype = getattr(torch, self.dtype)
        pipeline = load_pipeline(self.path, dtype, self.spec.pipeline_config)
        self._pipeline = pipeline.to(torch_device_of(device))
        # the event loop's own copy (prompt_unseen): a fast tokenizer's truncation and
        # padding are state of its Rust backend, which a call from another thread resets
        self._tokenizer = copy.deepcopy(getattr(pipeline, "tokenizer", None))
        self._device = torch_device_of(device)
        scale = int(getattr(pipeline, "vae_scale_factor", 8))
        self.grid = max(8, scale)
        unet = getattr(pipeline, "unet", None)
        side = int(unet.config.sample_size) if unet is not None else 64
        self.default_size = (side * scale, side * scale)
        vae = pipeline.vae.config
        # SDXL's pipelines (those with upcast_vae) cast a VAE whose config says
        # force_upcast to float32, in place, and back: for each float16 decode, and for
        # an edit's encode in any dtype but float32; SD 1.5's never do
        self.upcasts = (
            hasattr(pipeline, "upcast_vae")
            and bool(vae.get("force_upcast"))
            and dtype != torch.float32
        )
        self._geometry = DiffusionGeometry.from_configs(
            dict(unet.config) if unet is not None else {},
            dict(vae),
            scale,
            torch.finfo(dtype).bits // 8,
            vae_upcast=self.upcasts,
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

    # -- buckets (rows are batched as every image generator's: app.models.image_buckets) --
    def prior_bytes(self, bucket: Bucket) -> int:
        parsed = ImageBucket.parse(bucket.label)
        if parsed is None or self._geometry is None:
            return 0
        width, height, batch = parsed.width, parsed.height, parsed.batch
        return image_bytes(self._geometry, width, height, batch, tiled=parsed.tiled)

    def prompt_unseen(self, prompt: str) -> str | None:
        """What diffusers cuts off: the prompt's tokens past the first text encoder's
        window (CLIP's 77 positions, less its start and end marks), decoded."""
        tokenizer = self._tokenizer
        if tokenizer is None or not prompt:
            return None
        room = int(tokenizer.model_max_length) - 2
        if not getattr(tokenizer, "is_fast", False):
            ids = tokenizer(prompt, add_special_tokens=False, truncation=False).input_ids
            return str(tokenizer.decode(ids[room:])) if len(ids) > room else None
        encoded = tokenizer(
            prompt, add_special_tokens=False, truncation=False, return_offsets_mapping=True
        )
        if len(encoded.input_ids) <= room:
            return None
        return prompt[encoded.offset_mapping[room][0] :]  # the user's own words, as written

    # -- running -----------------------------------------------------------------------
    def forward(self, prepared: Prepared) -> Any:
        self.forward_calls += 1
        rows: list[ImagePrompt] = prepared.payload
        try:
            with self.batch_running(prepared) as progresses:  # listed in /status meanwhile
                images = self._run(rows, progresses, tiled=is_tiled(prepared))
        finally:
            if not self.running():
                with self._lock:
                    self._preview = None
        return [(pixels, row.output_format) for pixels, row in zip(images, rows, strict=True)]

    def _run(
        self, rows: list[ImagePrompt], progresses: list[ImageProgress], tiled: bool
    ) -> np.ndarray:
        first = rows[0]
        pipeline = for_run(self._pipeline, first.scheduler, first.task, tiled=tiled)
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
        serial = self._vae_lock if self.upcasts else contextlib.nullcontext()
        with torch.inference_mode(), serial:
            images = pipeline(**arguments).images
        return (images * 255).round().astype(np.uint8)  # as diffusers' numpy_to_pil

    def postprocess(self, raw: Any) -> Any:
        return [encode_image(pixels, output_format) for pixels, output_format in raw]

    def prime(self) -> None:
        self.forward(self.preprocess(self.probe_input()))
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
