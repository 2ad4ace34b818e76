"""BudgetBook: what a job costs in bytes, learned from measured peaks.

The price of a job is the P95 of the measured peak bytes in a sliding window for its
(model, bucket, device, dtype), times a penalty that grows with each out-of-memory.
An unseen bucket is priced conservatively, assuming a larger bucket never costs less:
- a larger measured neighbour exists: its price (a safe upper bound), shared with others;
- only smaller neighbours, or none: it runs *exclusive* (alone on the device) once so
  its true peak is measured; the quoted bytes are an extrapolation with a margin.

Pure Python, no torch. Owned by the event loop thread; persisted as JSON.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger("vramgate.budget")

WINDOW = 64
EXTRAPOLATION_MARGIN = 1.5
OOM_PENALTY = 1.5
MAX_PENALTY = 8.0
DEFAULT_RUN_S = 0.05
FILE_VERSION = 1


@dataclass(frozen=True)
class PriceKey:
    model: str
    bucket: str
    device: str
    dtype: str

    def family(self) -> tuple[str, str, str]:
        return (self.model, self.device, self.dtype)


@dataclass(frozen=True)
class Quote:
    nbytes: int
    exclusive: bool
    source: Literal["learned", "neighbour", "extrapolated", "unseen"]
    expected_s: float
    floor: int = 0  # proven need: the bucket failed alone with this much memory


def p95(values: list[int]) -> int:
    """Nearest-rank 95th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass
class _Entry:
    size: int
    peaks: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))
    run_s: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
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
        if not self.peaks:
            return None
        if self._price is None:
            self._price = max(math.ceil(p95(list(self.peaks)) * self.penalty), self.floor)
        return self._price

    def expected_s(self) -> float:
        if not self.run_s:
            return DEFAULT_RUN_S
        if self._expected_s is None:
            ordered = sorted(self.run_s)
            self._expected_s = ordered[len(ordered) // 2]
        return self._expected_s


class BudgetBook:
    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._entries: dict[PriceKey, _Entry] = {}
        self.dirty = False
        if path is not None:
            self._load(path)

    def quote(self, key: PriceKey, size: int, prior: int = 0) -> Quote:
        """The price of a job in `key`'s bucket (whose numeric size is `size`)."""
        entry = self._entries.get(key)
        learned = entry.price() if entry else None
        expected = entry.expected_s() if entry else self._neighbour_run_s(key, size)
        if learned is not None:
            return Quote(learned, False, "learned", expected)
        floor = entry.floor if entry else 0
        larger, smaller = self._neighbours(key, size)
        if larger is not None:
            return Quote(max(larger, floor, prior), False, "neighbour", expected)
        if smaller is not None:
            low_size, low_price = smaller
            guess = math.ceil(low_price * size / max(low_size, 1) * EXTRAPOLATION_MARGIN)
            return Quote(max(guess, floor, prior), True, "extrapolated", expected, floor)
        return Quote(max(prior, floor), True, "unseen", expected, floor)

    def record(self, key: PriceKey, size: int, peak: int, run_s: float) -> None:
        """A peak measured while the job ran alone (a clean sample)."""
        entry = self._entry(key, size)
        entry.peaks.append(max(0, int(peak)))
        entry.run_s.append(run_s)
        entry.changed()
        self.dirty = True

    def record_run_time(self, key: PriceKey, size: int, run_s: float) -> None:
        """A run that overlapped others: its peak is not its own, its time still counts."""
        entry = self._entry(key, size)
        entry.run_s.append(run_s)
        entry.changed()
        self.dirty = True

    def penalize(self, key: PriceKey, size: int, *, alone: bool, pool: int) -> None:
        """An out-of-memory in this bucket: raise its price."""
        entry = self._entry(key, size)
        entry.ooms += 1
        entry.penalty = min(MAX_PENALTY, entry.penalty * OOM_PENALTY)
        if alone:
            entry.floor = max(entry.floor, pool + 1)
        entry.changed()
        self.dirty = True

    def snapshot(self) -> list[dict[str, Any]]:
        rows = []
        for key, entry in sorted(self._entries.items(), key=lambda kv: (kv[0].model, kv[1].size)):
            rows.append(
                {
                    "model": key.model,
                    "bucket": key.bucket,
                    "size": entry.size,
                    "device": key.device,
                    "dtype": key.dtype,
                    "price_bytes": entry.price(),
                    "samples": len(entry.peaks),
                    "expected_run_s": round(entry.expected_s(), 6),
                    "penalty": entry.penalty,
                    "ooms": entry.ooms,
                }
            )
        return rows

    # -- persistence -------------------------------------------------------------------
    def save(self) -> None:
        if self._path is None:
            return
        data = {
            "version": FILE_VERSION,
            "entries": [
                {
                    "model": k.model,
                    "bucket": k.bucket,
                    "device": k.device,
                    "dtype": k.dtype,
                    "size": e.size,
                    "peaks": list(e.peaks),
                    "run_s": list(e.run_s),
                    "penalty": e.penalty,
                    "floor": e.floor,
                    "ooms": e.ooms,
                }
                for k, e in self._entries.items()
            ],
        }
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, self._path)  # atomic: a crash never leaves half a file
        self.dirty = False

    def _load(self, path: Path) -> None:
        if not path.is_file():
            return
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("version") != FILE_VERSION:
                raise ValueError(f"unknown version {data.get('version')!r}")
            for row in data["entries"]:
                key = PriceKey(row["model"], row["bucket"], row["device"], row["dtype"])
                entry = self._entry(key, int(row["size"]))
                entry.peaks.extend(int(p) for p in row["peaks"])
                entry.run_s.extend(float(r) for r in row["run_s"])
                entry.penalty = float(row.get("penalty", 1.0))
                entry.floor = int(row.get("floor", 0))
                entry.ooms = int(row.get("ooms", 0))
                entry.changed()
        except (ValueError, KeyError, TypeError) as exc:
            bad = path.with_suffix(".bad")
            os.replace(path, bad)
            self._entries.clear()
            log.warning("learned prices in %s unreadable (%s); moved to %s", path, exc, bad)

    # -- internals ---------------------------------------------------------------------
    def _entry(self, key: PriceKey, size: int) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(size=size)
        return entry

    def _family(self, key: PriceKey) -> list[tuple[int, int]]:
        """(size, price) of the learned buckets of the same model, device and dtype."""
        found = []
        for other, entry in self._entries.items():
            price = entry.price()
            if other != key and other.family() == key.family() and price is not None:
                found.append((entry.size, price))
        return found

    def _neighbours(self, key: PriceKey, size: int) -> tuple[int | None, tuple[int, int] | None]:
        family = self._family(key)
        larger = [price for s, price in family if s >= size]
        smaller = [(s, price) for s, price in family if s < size]
        return (
            min(larger) if larger else None,
            max(smaller) if smaller else None,
        )

    def _neighbour_run_s(self, key: PriceKey, size: int) -> float:
        times = [
            e.expected_s()
            for k, e in self._entries.items()
            if k.family() == key.family() and e.size >= size and e.run_s
        ]
        return min(times) if times else DEFAULT_RUN_S
