"""One price's record in the book: its window of measured peaks and run times, and the
penalty and floor that out-of-memory runs left. Pure Python."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

WINDOW = 64
DEFAULT_RUN_S = 0.05
OOM_PENALTY = 1.5
# A clean run after an out-of-memory divides the penalty by this: eight clean runs undo
# one OOM, so a price raised by a passing spike (another program, fragmentation) heals.
PENALTY_DECAY = OOM_PENALTY ** (1 / 8)


def p95(values: list[int]) -> int:
    """Nearest-rank 95th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass
class PriceEntry:
    """A one-shot bucket (`peaks` are whole peaks), or a generation's prompt bucket
    (`peaks` are the fixed part of clean runs, `per_token` its KV bytes per token)."""

    size: int
    peaks: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))
    run_s: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    per_token: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))
    generation: bool = False
    penalty: float = 1.0
    floor: int = 0  # the bucket once failed alone with this much memory
    ooms: int = 0
    # price() and expected_s() are asked on every request and change only when a sample
    # or a penalty comes in: remembered until changed() says otherwise
    _price: int | None = None
    _expected_s: float | None = None

    def changed(self) -> None:
        self._price = self._expected_s = None

    def price(self) -> int | None:
        """A one-shot bucket's price (a generation's depends on its tokens: `line`)."""
        if not self.peaks or self.generation:
            return None
        if self._price is None:
            self._price = max(math.ceil(p95(list(self.peaks)) * self.penalty), self.floor)
        return self._price

    def fixed(self) -> int | None:
        """A generation bucket's measured fixed part (P95 of its clean runs)."""
        return p95(list(self.peaks)) if self.peaks else None

    def rate(self) -> int | None:
        """A generation bucket's measured KV bytes per token (P95)."""
        return p95(list(self.per_token)) if self.per_token else None

    def clean_run(self) -> None:
        """A clean run disproves a floor and wears an out-of-memory penalty down."""
        self.floor = 0
        decayed = self.penalty / PENALTY_DECAY
        self.penalty = decayed if decayed > 1.0 + 1e-9 else 1.0

    def expected_s(self) -> float:
        if not self.run_s:
            return DEFAULT_RUN_S
        if self._expected_s is None:
            ordered = sorted(self.run_s)
            self._expected_s = ordered[len(ordered) // 2]
        return self._expected_s
