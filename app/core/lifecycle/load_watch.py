"""A model's load under way, watched where the person and the caller look: its `/status`
row says the phase it is in and how far it has come (`load_view`), and its log says each
new phase and, on a long load, how far it has come every `REMIND_S` (`LoadWatch`).

How far: the bytes the load holds against those it was planned to take, where its
engine can measure them (a llama.cpp runner: app.engines.llama_cpp.runner_model);
else the time it has taken against the last load of the same model in this process.
A first load of a model whose engine measures nothing says its phase and time only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from app.models.base import LoadProgress

log = logging.getLogger("vramgate.registry")

WATCH_S = 0.25  # how often a load's progress is looked at for its log
REMIND_S = 10.0  # a long phase is said again this often, with how far it has come
WAITING = "waiting for memory"  # loading, not begun: the gate has not admitted its bytes


def load_view(
    progress: LoadProgress | None, elapsed_s: float | None, expected_s: float | None
) -> dict[str, Any]:
    """A loading model's `load` in /status: its phase (of how many), how far it has come
    (`fraction`, and what from), its seconds so far and those the last load took.
    `elapsed_s` None: not begun (waiting for the gate)."""
    if elapsed_s is None:
        return {"phase": WAITING, "fraction": None, "fraction_from": None, "elapsed_s": None}
    view: dict[str, Any] = {
        "phase": progress.phase if progress is not None else "loading",
        "step": progress.step if progress is not None else None,
        "steps": progress.steps if progress is not None else None,
        "fraction": None,
        "fraction_from": None,
        "elapsed_s": round(elapsed_s, 1),
        "expected_s": round(expected_s, 1) if expected_s else None,
        "held_bytes": progress.held_bytes if progress is not None else None,
        "planned_bytes": progress.planned_bytes if progress is not None else None,
    }
    if progress is not None and progress.fraction is not None:
        view |= {"fraction": progress.fraction, "fraction_from": "bytes held of planned"}
    elif expected_s:
        fraction = round(min(elapsed_s / expected_s, 0.99), 3)
        view |= {"fraction": fraction, "fraction_from": "time of its last load"}
    return view


def said(view: dict[str, Any]) -> str:
    """A load's view in a log line's words: `loading the weights (3 of 7), 41%, 2.5 s`."""
    text = view["phase"]
    if view.get("step") and view.get("steps"):
        text += f" ({view['step']} of {view['steps']})"
    if view.get("fraction") is not None:
        text += f", {view['fraction'] * 100:.0f}%"
    if view.get("elapsed_s") is not None:
        text += f", {view['elapsed_s']:.1f} s"
    return text


class LoadWatch:
    """While a load runs (`with LoadWatch(...)`), a thread of its own logs each phase its
    engine reaches, and every `remind_s` how far the load has come."""

    def __init__(
        self,
        name: str,
        progress: Callable[[], LoadProgress | None],
        expected_s: float | None,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = WATCH_S,
        remind_s: float = REMIND_S,
    ) -> None:
        self.name, self._progress, self._expected = name, progress, expected_s
        self._clock, self._every, self._remind = clock, every_s, remind_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"load-{name}", daemon=True)
        self.began = clock()

    def __enter__(self) -> LoadWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=2.0)

    def _watch(self) -> None:
        phase, said_at, last = None, self.began, None
        while not self._done.wait(self._every):
            try:  # an engine done with its part (the load measuring it) keeps its last phase
                progress = last = self._progress() or last
            except Exception:  # a look at a load must never fail it
                log.debug(
                    "model %s: its load's progress could not be read", self.name, exc_info=True
                )
                continue
            now = self._clock()
            view = load_view(progress, now - self.began, self._expected)
            if view["phase"] != phase or now - said_at >= self._remind:
                log.info("model %s loading: %s", self.name, said(view))
                phase, said_at = view["phase"], now
