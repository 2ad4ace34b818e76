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


# Below this many samples the nearest-rank P95 is the largest seen: no percentile yet
P95_SAMPLES = 20
# A price from one sample, which shows no spread, allows this much above it (a
# generation's measured parts have the same margin: app.sched.budget.MEASURED_MARGIN)
ONE_SAMPLE_MARGIN = 1.1


def peak_price(values: list[int]) -> int:
    """What a bucket with these measured peaks is priced at: their P95 once there are
    P95_SAMPLES. Before that the P95 is only the largest seen, and the next run may come
    above it by as much as runs were seen to vary: the largest plus the spread between
    the smallest and the largest; from a single sample, ONE_SAMPLE_MARGIN over it. (A
    flood priced on one warm-up sample a bucket, with peaks varying 25% run to run, ran
    out of memory 30-40 times in 250 requests.)"""
    top = p95(values)
    if len(values) >= P95_SAMPLES:
        return top
    if len(values) == 1:
        return math.ceil(top * ONE_SAMPLE_MARGIN)
    return top + max(values) - min(values)


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
            self._price = max(math.ceil(peak_price(list(self.peaks)) * self.penalty), self.floor)
        return self._price

    def measured(self) -> int | None:
        """A one-shot bucket's P95 with its penalty, no allowance for the spread: what a
        larger bucket is extrapolated from (with a margin of its own for the unknown)."""
        if not self.peaks or self.generation:
            return None
        return max(math.ceil(p95(list(self.peaks)) * self.penalty), self.floor)

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
