"""What a pull tells the person as it goes: its steps, and bytes done of a total with the
speed and the time left, on the terminal (a tqdm bar) or as Ollama's pull progress
events."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from app.store.sources import PullError


class PullCancelled(PullError):
    """The person cancelled the pull: it stopped at its next step or chunk; what came is
    kept, and pulling the same again resumes it."""


class Progress:
    """What a pull tells the person: its steps, and bytes done of a total. This one writes
    to the terminal (a tqdm bar: bytes, speed, time left); `EventProgress` hands each as
    an event."""

    def __init__(self) -> None:
        self._bar: Any = None

    def step(self, text: str) -> None:
        print(text, flush=True)

    def begin(self, what: str, total: int, done: int = 0) -> None:
        """`done`: bytes already in place (a resumed download): counted in the total, not
        in the speed."""
        from tqdm import tqdm

        self._bar = tqdm(
            total=total, initial=done, unit="B", unit_scale=True, unit_divisor=1024, desc=what
        )

    def advance(self, nbytes: int) -> None:
        if self._bar is not None:
            self._bar.update(nbytes)

    def end(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def speed_and_time_left(moved: int, seconds: float, left: int) -> tuple[float | None, float | None]:
    """Bytes per second over `seconds` in which `moved` bytes came, and the seconds the
    `left` bytes will take at that speed (None before the first byte)."""
    if moved <= 0 or seconds <= 0:
        return None, None
    speed = moved / seconds
    return speed, left / speed


class EventProgress(Progress):
    """Steps and byte counts as events, in the shape of Ollama's pull progress
    (`status`, and `total` and `completed` for bytes; with `bytes_per_second` and
    `seconds_left` once bytes come), a byte count at most once per percent. `emit` is
    called on the pulling thread."""

    def __init__(
        self,
        emit: Callable[[dict[str, Any]], None],
        clock: Callable[[], float] = time.monotonic,
        cancel: threading.Event | None = None,
    ) -> None:
        super().__init__()
        self._emit = emit
        self._clock = clock
        self._cancel = cancel  # once set, the pull stops at its next step or chunk
        self._what, self._total, self._done, self._sent = "", 0, 0, -1
        self._start, self._started_at = 0, 0.0

    def step(self, text: str) -> None:
        self._check()
        self._emit({"status": text})

    def begin(self, what: str, total: int, done: int = 0) -> None:
        self._what, self._total, self._done, self._sent = what, total, done, -1
        self._start, self._started_at = done, self._clock()
        self._send()

    def advance(self, nbytes: int) -> None:
        self._check()
        self._done += nbytes
        if (self._done - self._sent) * 100 >= self._total or self._done >= self._total:
            self._send()

    def end(self) -> None:
        if self._sent != self._done:
            self._send()

    def _check(self) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise PullCancelled(
                "the pull was cancelled; what came is kept, and pulling it again resumes it"
            )

    def _send(self) -> None:
        self._sent = self._done
        event: dict[str, Any] = {
            "status": self._what,
            "total": self._total,
            "completed": self._done,
        }
        speed, left = speed_and_time_left(
            self._done - self._start,
            self._clock() - self._started_at,
            max(self._total - self._done, 0),
        )
        if speed is not None and left is not None:
            event |= {"bytes_per_second": round(speed), "seconds_left": round(left, 1)}
        self._emit(event)
