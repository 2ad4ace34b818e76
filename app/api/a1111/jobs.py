"""AUTOMATIC1111's view of its own calls, kept per server: the checkpoint its calls go to
(`/sdapi/v1/options`), and the txt2img/img2img calls under way, oldest first. A caller's
first is its A1111 "current job", which its `/progress` reports (its step, an ETA, its
latent preview) and its `/interrupt` stops at its next step: callers are told apart by
their address (`caller_of`), so one machine neither sees another's pictures being drawn
nor stops them (on loopback every local program is the same user's: SECURITY.md). Used
on the event loop only: no lock (each job's ImageProgress has its own, for the inference
thread that writes it)."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from app.api.callers import client_address
from app.models.image_prompt import ImageProgress
from app.models.images import encode_png


def caller_of(request: Request) -> str:
    """Who is calling, as far as an A1111 job is concerned: the client's address."""
    return client_address(request)


@dataclass
class Job:
    caller: str
    started: float = field(default_factory=time.monotonic)
    timestamp: str = field(default_factory=lambda: time.strftime("%Y%m%d%H%M%S"))
    progress: ImageProgress = field(default_factory=lambda: ImageProgress(previews=True))
    interrupted: bool = False


class A1111Jobs:
    def __init__(self) -> None:
        self.checkpoint: str | None = None  # None: the first image model served
        self._jobs: list[Job] = []

    @contextmanager
    def job(self, caller: str) -> Iterator[Job]:
        """One call's job, listed while it waits and runs."""
        job = Job(caller)
        self._jobs.append(job)
        try:
            yield job
        finally:
            self._jobs.remove(job)

    def _of(self, caller: str) -> list[Job]:
        return [job for job in self._jobs if job.caller == caller]

    def interrupt(self, caller: str) -> bool:
        """Stop the caller's current job at its next step (it answers with what it has
        then); False: the caller has none under way."""
        own = self._of(caller)
        if not own:
            return False
        own[0].interrupted = True
        own[0].progress.cancel()
        return True

    def progress(self, caller: str, skip_current_image: bool = False) -> dict[str, Any]:
        """`/sdapi/v1/progress`'s answer for the caller, in A1111's shape."""
        own = self._of(caller)
        job = own[0] if own else None
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
            "job": f"job {len(own)}" if job is not None else "",
            "job_count": len(own),
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
