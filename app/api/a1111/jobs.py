"""AUTOMATIC1111's view of its own calls, kept per server: the checkpoint its calls go to
(`/sdapi/v1/options`), and the txt2img/img2img calls under way, oldest first — the first
is A1111's "current job", which `/progress` reports (its step, an ETA, its latent
preview) and `/interrupt` stops at its next step. Used on the event loop only: no lock
(each job's ImageProgress has its own, for the inference thread that writes it)."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from app.models.image_prompt import ImageProgress
from app.models.images import encode_png


@dataclass
class Job:
    started: float = field(default_factory=time.monotonic)
    timestamp: str = field(default_factory=lambda: time.strftime("%Y%m%d%H%M%S"))
    progress: ImageProgress = field(default_factory=lambda: ImageProgress(previews=True))
    interrupted: bool = False


class A1111Jobs:
    def __init__(self) -> None:
        self.checkpoint: str | None = None  # None: the first image model served
        self._jobs: list[Job] = []

    @contextmanager
    def job(self) -> Iterator[Job]:
        """One call's job, listed while it waits and runs."""
        job = Job()
        self._jobs.append(job)
        try:
            yield job
        finally:
            self._jobs.remove(job)

    def interrupt(self) -> bool:
        """Stop the current job at its next step (it answers with what it has then)."""
        if not self._jobs:
            return False
        self._jobs[0].interrupted = True
        self._jobs[0].progress.cancel()
        return True

    def progress(self, skip_current_image: bool = False) -> dict[str, Any]:
        """`/sdapi/v1/progress`'s answer, in A1111's shape."""
        job = self._jobs[0] if self._jobs else None
        step, steps = job.progress.read() if job is not None else (0, 0)
        fraction = step / steps if steps else 0.0
        elapsed = time.monotonic() - job.started if job is not None else 0.0
        image = None
        if job is not None and not skip_current_image:
            _, previews = job.progress.preview()
            if previews:
                image = base64.b64encode(encode_png(previews[0])).decode("ascii")
        state = {
            "skipped": False,
            "interrupted": job.interrupted if job is not None else False,
            "stopping_generation": False,
            "job": f"job {len(self._jobs)}" if job is not None else "",
            "job_count": len(self._jobs),
            "job_timestamp": job.timestamp if job is not None else "0",
            "job_no": 0,
            "sampling_step": step,
            "sampling_steps": steps,
        }
        return {
            "progress": round(fraction, 4),
            "eta_relative": round(elapsed / fraction - elapsed, 3) if fraction else 0.0,
            "state": state,
            "current_image": image,
            "textinfo": None,
        }
