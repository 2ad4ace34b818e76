"""How long an idle model stays loaded: Ollama's `keep_alive`.

A duration: seconds as a number, or text such as "30s", "5m", "1h", "1h30m", "250ms";
0 unloads the model once the request is answered; a negative one (-1) keeps it loaded
for good. Each model has one (the `keep_alive` setting, or its own in the config); a
request may set its model's anew (`keep_alive` in its body), as Ollama's do. A model
idles from the moment its last request is answered; the warm-up and readiness probes
neither start nor extend that time.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable


class InFlight(Counter[str]):
    """Each model's requests between admission and reply, and when each model's last
    request was answered (its idle time starts then; `used` marks a real request, so
    the probes' own count changes do not)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__()
        self._clock = clock
        self.idle_since: dict[str, float] = {}
        self._used: set[str] = set()

    def used(self, model: str) -> None:
        self._used.add(model)

    def __setitem__(self, model: str, count: int) -> None:
        super().__setitem__(model, count)
        if count == 0 and model in self._used:
            self._used.discard(model)
            self.idle_since[model] = self._clock()


class KeepAlive:
    """Which loaded models have idled past their keep-alive."""

    def __init__(self, default: Callable[[str], float], in_flight: InFlight) -> None:
        self._default = default  # a model's own keep-alive (its config, or the setting)
        self._in_flight = in_flight
        self._asked: dict[str, float] = {}  # what the model's last request asked for

    def request(self, model: str, keep_alive: float | None, now: float) -> None:
        """A request for `model` arrived (asking `keep_alive` seconds, or its default):
        the model is not idle from now until it is answered."""
        if keep_alive is not None:
            self._asked[model] = keep_alive
        self._in_flight.used(model)
        if model in self._in_flight.idle_since:
            self._in_flight.idle_since[model] = now

    def loaded(self, model: str, now: float) -> None:
        """A model was just loaded: it idles from now."""
        self._in_flight.idle_since[model] = now

    def unloaded(self, model: str) -> None:
        """A model was unloaded: what its requests asked for ends with it (a request that
        arrives meanwhile asks anew, for the reload it waits for)."""
        self._asked.pop(model, None)

    def seconds(self, model: str) -> float:
        """The model's keep-alive now (math.inf: never unloaded)."""
        seconds = self._asked.get(model, self._default(model))
        return math.inf if seconds < 0 else seconds

    def left(self, model: str, now: float) -> float | None:
        """Seconds until an idle `model` goes (None: busy, or not known to idle)."""
        since = self._in_flight.idle_since.get(model)
        if since is None or self._in_flight[model]:
            return None
        return max(0.0, since + self.seconds(model) - now)

    def expired(self, models: list[str], now: float) -> list[str]:
        return [m for m in models if (left := self.left(m, now)) is not None and left <= 0]
