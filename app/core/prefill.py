"""How long the prefills running now will still take: a request admitted now waits for
them, since the device's compute is shared among what runs (llama.cpp fills each step's
batch with every running prompt's tokens; the torch engine prefills beside its decodes).
The gate's estimate counts the queue and the runs' learned times; a long prompt's
prefill (minutes on a CPU for 8k tokens) is more than either, and learned here per model
as seconds per prompt token from the streams that ran."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

# fewer tokens prefilled than this say more of the step's fixed cost than of the rate
MIN_TOKENS = 32
WINDOW = 16  # the latest samples per model


@dataclass(frozen=True)
class Prefilling:
    """A stream whose first token has not come yet."""

    model: str
    tokens: int  # its prompt's tokens (what a prefix cache holds is not known yet)
    elapsed_s: float  # since it was admitted


class PrefillClock:
    def __init__(self) -> None:
        self._samples: dict[str, deque[float]] = {}

    def record(self, model: str, tokens: int, seconds: float) -> None:
        """A stream's prefill: `tokens` prompt tokens computed (not found cached) in
        `seconds` from its admission to its first step."""
        if tokens >= MIN_TOKENS and seconds > 0:
            self._samples.setdefault(model, deque(maxlen=WINDOW)).append(seconds / tokens)

    def per_token_s(self, model: str) -> float | None:
        """The model's median seconds per prompt token; None before a sample."""
        samples = self._samples.get(model)
        return statistics.median(samples) if samples else None

    def remaining_s(self, running: Iterable[Prefilling]) -> float:
        """The running prefills' time still to come, added up (they share the device).
        One whose model has a rate: its prompt at that rate less the time it has had,
        but never less than half that time (a long prompt costs more than linearly, and
        outruns a rate learned on shorter ones); one with none yet: as long again as it
        has run."""
        total = 0.0
        for run in running:
            rate = self.per_token_s(run.model)
            if rate is None:
                total += run.elapsed_s
                continue
            total += max(rate * run.tokens - run.elapsed_s, run.elapsed_s / 2)
        return total
