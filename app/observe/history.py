"""What the dashboard draws: a ring of once-a-second samples and the recent rejections.

Pure; owned by the event loop thread.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

WINDOW_S = 600  # ten minutes of one-second samples
MAX_REJECTIONS = 50


@dataclass(frozen=True)
class Sample:
    t: float  # wall-clock seconds
    total: int
    used_by_others: int
    used_by_us: int
    admitted: int
    pool: int
    depth: int
    running: int


@dataclass(frozen=True)
class Rejection:
    t: float
    model: str
    code: str
    message: str


class History:
    def __init__(self) -> None:
        self.samples: deque[Sample] = deque(maxlen=WINDOW_S)
        self.rejections: deque[Rejection] = deque(maxlen=MAX_REJECTIONS)

    def add_sample(self, sample: Sample) -> None:
        self.samples.append(sample)

    def add_rejection(self, model: str, code: str, message: str) -> None:
        self.rejections.append(Rejection(time.time(), model, code, message[:200]))

    def as_dict(self) -> dict[str, Any]:
        return {
            "samples": [asdict(s) for s in self.samples],
            "rejections": [asdict(r) for r in reversed(self.rejections)],
        }
