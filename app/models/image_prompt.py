"""What an image generator is asked for, row by row, and how a running request is
watched: its progress (step i of n) and whether its client has left. Torch-free: the
routes, the request types and the tray read these."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Literal

OutputFormat = Literal["png", "jpeg", "webp"]


class ImageProgress:
    """One request's run, shared by its rows and by whoever watches it. Written by the
    inference thread at each step, read by /status and set cancelled by the route: its
    lock makes (step, steps) one consistent pair."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _step and _steps together
        self._step = 0
        self._steps = 0
        self._cancelled = threading.Event()

    def advance(self, step: int, steps: int) -> None:
        with self._lock:
            self._step, self._steps = step, steps

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
    (a request's rows take seed, seed + 1, ...)."""

    prompt: str
    seed: int
    width: int | None = None
    height: int | None = None
    steps: int | None = None
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    scheduler: str | None = None
    output_format: OutputFormat = "png"
    progress: ImageProgress = field(default_factory=ImageProgress, compare=False)
