"""What an image generator is asked for, row by row, and how a running request is
watched: its progress (step i of n), its latest latent preview, and whether its client
has left. Torch-free: the routes, the request types and the tray read these."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

# The schedulers a request may name (diffusers' classes behind them: the torch engine's
# app.engines.torch.diffusion.pipeline.SCHEDULER_CLASSES)
SCHEDULERS = (
    "euler",
    "euler_a",
    "ddim",
    "pndm",
    "lms",
    "heun",
    "dpm++_2m",
    "dpm++_2m_karras",
    "unipc",
)

OutputFormat = Literal["png", "jpeg", "webp"]
Task = Literal["text2image", "image2image", "inpainting"]


class ImageProgress:
    """One request's run, shared by its rows and by whoever watches it. Written by the
    inference thread at each step, read by /status and set cancelled by the route: its
    lock makes (step, steps) one consistent pair."""

    def __init__(self, previews: bool = False, partial_images: int = 0) -> None:
        self._lock = threading.Lock()  # guards the step, steps and previews together
        self._step = 0
        self._steps = 0
        self._cancelled = threading.Event()
        # whether the run maps its latents to RGB at each step (app.engines.torch.diffusion.preview)
        self.previews = previews or partial_images > 0
        self.partial_images = partial_images  # how many previews to keep along the way
        self._previews: list[np.ndarray] = []  # its rows' latest previews, HWC uint8
        self._preview_step = 0  # the step they show
        self._partials: list[list[np.ndarray]] = []  # kept at evenly spaced steps

    def advance(self, step: int, steps: int, previews: list[np.ndarray] | None = None) -> None:
        with self._lock:
            self._step, self._steps = step, steps
            if previews is None:
                return
            self._previews, self._preview_step = previews, step
            if self._partial_due(step, steps):
                self._partials.append(previews)

    def due(self, step: int, steps: int) -> bool:
        """Whether a partial image is to be kept at this step (the run then maps its
        latents to RGB whatever else it does)."""
        with self._lock:
            return self._partial_due(step, steps)

    def _partial_due(self, step: int, steps: int) -> bool:
        # the i-th of k is kept at step ceil(steps * (i + 1) / (k + 1)) or the first after
        kept = len(self._partials)
        return kept < self.partial_images and step * (self.partial_images + 1) >= steps * (kept + 1)

    def preview(self) -> tuple[int, list[np.ndarray]]:
        """The step of its latest previews and its rows' previews then ([] before any)."""
        with self._lock:
            return self._preview_step, list(self._previews)

    def partials(self, start: int = 0) -> list[list[np.ndarray]]:
        """The previews kept along the way (at most `partial_images`), from `start` on;
        fewer when the run has fewer steps than that."""
        with self._lock:
            return self._partials[start:]

    def read(self) -> tuple[int, int]:
        """(steps done, steps in all); (0, 0) before it starts."""
        with self._lock:
            return self._step, self._steps

    def cancel(self) -> None:
        """Its client left: its rows stop at the next step where nothing else needs them."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


@dataclass(frozen=True)
class ImagePrompt:
    """One image to make. `width`/`height` None: the model's default size; `steps`,
    `guidance_scale`, `scheduler` None: the pipeline's own. The seed is this row's alone
    (a request's rows take seed, seed + 1, ...).

    With `init_image` (HWC uint8 RGB, decoded and bounded by the route) it is an image to
    image row, denoised from `strength` (0 < s <= 1; None: the pipeline's default) of the
    way; with a `mask` too (HW uint8, 255 where it is repainted) an inpainting row. Both
    are resized to `width`x`height` when they differ."""

    prompt: str
    seed: int
    width: int | None = None
    height: int | None = None
    steps: int | None = None
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    scheduler: str | None = None
    output_format: OutputFormat = "png"
    init_image: np.ndarray | None = field(default=None, compare=False, repr=False)
    mask: np.ndarray | None = field(default=None, compare=False, repr=False)
    strength: float | None = None
    progress: ImageProgress = field(default_factory=ImageProgress, compare=False)

    @property
    def task(self) -> Task:
        if self.init_image is None:
            return "text2image"
        return "image2image" if self.mask is None else "inpainting"
