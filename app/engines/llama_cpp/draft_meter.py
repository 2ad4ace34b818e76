"""What a runner's speculation gives, measured as its requests run, and whether it pays.
Pure: each finished request's figures in (as llama.cpp's timings give them, with the
number of streams that ran beside it), totals and a verdict out.

A verdict reads the recent requests only (`WINDOW`): while fewer than `MIN_DRAFTED`
tokens were drafted there is nothing to judge, and speculation stays. Drafts rarely
accepted (below `RARELY`) do not pay at any number of streams: each rejected draft was
a step's worth of tokens verified for nothing. Otherwise the tokens/s it gave decide, at
the number of streams asked about: the requests that drafted against those that did
not (free text finds no chain and drafts nothing, so the runner's speed without drafts
is measured beside its speed with them), each side at least `MIN_SAMPLES` requests of
the same band of streams (1, 2-3, 4-7, 8-15, 16-31, 32 and more). A drafting request
also slows those that share its steps, so this comparison leans toward "pays" where many
streams run; acceptance bounds it from below.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from statistics import median
from typing import Any

WINDOW = 256  # the recent requests a verdict reads
MIN_DRAFTED = 256  # drafted tokens in the window before acceptance says anything
RARELY = 0.3  # accepted / drafted below this: its drafts are rarely accepted
MIN_SAMPLES = 8  # requests on each side of a band before their tokens/s are compared


def band(streams: int) -> int:
    """The band of a number of streams: 1, 2-3, 4-7, ... as 1, 2, 3, ...; 32 and more as 6."""
    return min(max(streams, 1).bit_length(), 6)


@dataclass(frozen=True)
class DraftSample:
    """One finished request: the streams that ran beside it (itself included), its
    tokens, the tokens drafted for it and accepted, its seconds from first token to last."""

    streams: int
    tokens: int
    drafted: int
    accepted: int
    decode_s: float


@dataclass(frozen=True)
class Verdict:
    pays: bool
    why: str


class DraftMeter:
    """One model's speculation, across its runners: totals since it was created, and
    the recent requests a verdict reads."""

    def __init__(self) -> None:
        self.requests = 0
        self.drafted = 0
        self.accepted = 0
        self.recent: deque[DraftSample] = deque(maxlen=WINDOW)

    def record(self, sample: DraftSample) -> None:
        self.requests += 1
        self.drafted += sample.drafted
        self.accepted += sample.accepted
        self.recent.append(sample)

    def typical_streams(self) -> int:
        """The streams its recent requests ran beside (their median; 1 before any)."""
        return int(median(s.streams for s in self.recent)) if self.recent else 1

    def verdict(self, streams: int) -> Verdict:
        """Whether speculation pays with `streams` running, from the recent requests."""
        drafted = sum(s.drafted for s in self.recent)
        accepted = sum(s.accepted for s in self.recent)
        if drafted < MIN_DRAFTED:
            return Verdict(True, f"measuring: {drafted} tokens drafted of {MIN_DRAFTED} needed")
        share = accepted / drafted
        if share < RARELY:
            return Verdict(False, f"its drafts are rarely accepted ({share:.2f} of {drafted})")
        with_drafts, without = self._rates(band(streams))
        if with_drafts is not None and without is not None and with_drafts < without:
            return Verdict(
                False,
                f"with {streams} streams, requests that drafted ran {with_drafts:.1f} tokens/s, "
                f"those that did not {without:.1f}",
            )
        return Verdict(True, f"{share:.2f} of {drafted} drafted tokens accepted")

    def _rates(self, at: int) -> tuple[float | None, float | None]:
        """Tokens/s of the window's requests at band `at` that drafted, and that did not
        (None: fewer than MIN_SAMPLES of them)."""
        same = [s for s in self.recent if band(s.streams) == at and s.decode_s > 0]
        drafting = [s for s in same if s.drafted > 0]
        plain = [s for s in same if s.drafted == 0]
        return _rate(drafting), _rate(plain)

    def describe(self) -> dict[str, Any]:
        """Its figures for /status: totals, and the tokens/s with drafts and without at
        the streams its recent requests ran beside."""
        with_drafts, without = self._rates(band(self.typical_streams()))
        return {
            "requests": self.requests,
            "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            "acceptance": round(self.accepted / self.drafted, 3) if self.drafted else None,
            "typical_streams": self.typical_streams(),
            "tokens_per_s_drafting": round(with_drafts, 1) if with_drafts else None,
            "tokens_per_s_not_drafting": round(without, 1) if without else None,
        }


def _rate(samples: list[DraftSample]) -> float | None:
    if len(samples) < MIN_SAMPLES:
        return None
    return sum(s.tokens for s in samples) / sum(s.decode_s for s in samples)
