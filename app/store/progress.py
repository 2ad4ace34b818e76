"""What a pull tells the person as it goes: its steps, and bytes done of a total, on the
terminal (a tqdm bar) or as Ollama's pull progress events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Progress:
    """What a pull tells the person: its steps, and bytes done of a total. This one writes
    to the terminal (a tqdm bar); `EventProgress` hands each as an event."""

    def __init__(self) -> None:
        self._bar: Any = None

    def step(self, text: str) -> None:
        print(text, flush=True)

    def begin(self, what: str, total: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, unit="B", unit_scale=True, desc=what)

    def advance(self, nbytes: int) -> None:
        if self._bar is not None:
            self._bar.update(nbytes)

    def end(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class EventProgress(Progress):
    """Steps and byte counts as events, in the shape of Ollama's pull progress
    (`status`, and `total` and `completed` for bytes), a byte count at most once per
    percent. `emit` is called on the pulling thread."""

    def __init__(self, emit: Callable[[dict[str, Any]], None]) -> None:
        super().__init__()
        self._emit = emit
        self._what, self._total, self._done, self._sent = "", 0, 0, -1

    def step(self, text: str) -> None:
        self._emit({"status": text})

    def begin(self, what: str, total: int) -> None:
        self._what, self._total, self._done, self._sent = what, total, 0, -1
        self._send()

    def advance(self, nbytes: int) -> None:
        self._done += nbytes
        if (self._done - self._sent) * 100 >= self._total or self._done >= self._total:
            self._send()

    def end(self) -> None:
        if self._sent != self._done:
            self._send()

    def _send(self) -> None:
        self._sent = self._done
        self._emit({"status": self._what, "total": self._total, "completed": self._done})
