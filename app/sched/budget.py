"""BudgetBook: what a job costs in bytes, learned from measured peaks.

One-shot jobs (embeddings, images): the price is the P95 of the measured peak bytes in a
sliding window for its (model, bucket, device, dtype, fingerprint), allowing for the
spread seen while it has fewer than 20 (app.sched.entry.peak_price), times a penalty
that grows with each out-of-memory and decays with each clean run after it. An unseen bucket
is priced conservatively, assuming a larger bucket never costs less:
- a larger measured neighbour exists: its price (a safe upper bound), shared with others;
- only smaller neighbours, or none: it runs *exclusive* (alone on the device) once so
  its true peak is measured; the quoted bytes are an extrapolation with a margin.

Generations: a price is a line, `fixed + per_token × tokens`, where `tokens` is the most
its KV cache may hold (prompt + max_tokens, rounded up) and `fixed` covers the prefill's
activations and logits. `per_token` is measured from every finished generation (its own
KV cache's bytes over the tokens in it, whoever else ran meanwhile), `fixed` from the
clean runs (peak − per_token × tokens held); until measured, both come from the model's
geometry (config: layers, KV heads, head size, element size). So a chat that stops early
teaches as much as one that ran to `max_tokens`, and only a model whose geometry is
unknown runs alone before its first measurement.

The fingerprint names the weights (file sizes, times, config): a changed model relearns.

Pure Python, no torch. Owned by the event loop thread; persisted as JSON.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from app.sched.entry import (
    DEFAULT_RUN_S,
    OOM_PENALTY,
    PriceEntry,
)

log = logging.getLogger("vramgate.budget")

EXTRAPOLATION_MARGIN = 1.5
MAX_PENALTY = 8.0
# Generations: a measured part of the line is priced with MEASURED_MARGIN, a part that is
# still the geometry's estimate with GEOMETRY_MARGIN.
MEASURED_MARGIN = 1.1
GEOMETRY_MARGIN = 1.5
FILE_VERSION = 2

# "reserved": a request that holds nothing beyond its model's own reservation (a runner's
# KV cells, taken at load): it costs no further bytes and is admitted by the model's slots
Source = Literal[
    "learned", "neighbour", "extrapolated", "unseen", "geometry", "learned_rate", "reserved"
]


class PriceKey(NamedTuple):
    """Where a price is kept. A named tuple, not a frozen dataclass: it is built and
    hashed on every request, and a tuple does both in C (0.2 against 0.8 µs)."""

    model: str
    bucket: str
    device: str
    dtype: str
    fingerprint: str = ""  # what identifies the weights; a changed model relearns

    def family(self) -> tuple[str, str, str, str, str]:
        """The buckets that price one another by size: one model's weights on one device,
        run the same way (a bucket's variant follows `~` in its label: a tiled decode)."""
        variant = self.bucket.partition("~")[2]
        return (self.model, self.device, self.dtype, self.fingerprint, variant)


@dataclass(frozen=True)
class Geometry:
    """What a generating model's config says a generation costs, before any measurement."""

    kv_bytes_per_token: int  # 2 × layers × kv_heads × head_dim × element size; 0: unknown
    fixed_bytes: int  # the prefill's activations and logits for this prompt bucket


class Quote(NamedTuple):
    """A price: one per request, so a named tuple as PriceKey."""

    nbytes: int
    exclusive: bool
    source: Source
    expected_s: float
    floor: int = 0  # proven need: the bucket failed alone with this much memory
    # what it holds within its model's reservation (a runner's KV cells): its price as
    # the caller is shown it, not admitted again (`nbytes` is 0 then)
    held: int = 0
    # a learned price: the largest peak measured, in which the bucket did run. Its
    # price allows for the spread above that and may pass the device; this may not
    ran_in: int = 0


def line_source(rate: int | None, fixed: int | None) -> Source:
    """Where a generation line comes from: both parts measured, the rate only, or the
    model's geometry alone."""
    if rate is None:
        return "geometry"
    return "learned" if fixed is not None else "learned_rate"


@dataclass(frozen=True)
class GenerationSample:
    """What one finished generation measured."""

    kv_tokens: int  # tokens its KV cache held at the end (prompt + produced)
    kv_bytes: int  # that cache's own bytes (0: the model cannot tell)
    peak: int  # the device's peak above the run's start; its own only if `clean`
    run_s: float
    clean: bool  # it ran alone: the peak is all its own


class BudgetBook:
    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._entries: dict[PriceKey, PriceEntry] = {}
        self.dirty = False
        if path is not None:
            self._load(path)

    def quote(self, key: PriceKey, size: int, prior: int = 0) -> Quote:
        """The price of a one-shot job in `key`'s bucket (whose numeric size is `size`)."""
        entry = self._entries.get(key)
        learned = entry.price() if entry else None
        expected = entry.expected_s() if entry else self._neighbour_run_s(key, size)
        if learned is not None:
            return Quote(learned, False, "learned", expected, ran_in=max(entry.peaks))
        floor = entry.floor if entry else 0
        larger, smaller = self._neighbours(key, size)
        if larger is not None:
            return Quote(max(larger, floor, prior), False, "neighbour", expected)
        if smaller is not None:
            low_size, low_price = smaller
            guess = math.ceil(low_price * size / max(low_size, 1) * EXTRAPOLATION_MARGIN)
            return Quote(max(guess, floor, prior), True, "extrapolated", expected, floor)
        return Quote(max(prior, floor), True, "unseen", expected, floor)

    def quote_reserved(self, key: PriceKey) -> Quote:
        """A request whose bytes its model reserved at load: no bytes, never alone, and
        the run time learned like any bucket's."""
        entry = self._entries.get(key)
        return Quote(0, False, "reserved", entry.expected_s() if entry else DEFAULT_RUN_S)

    def quote_generation(self, key: PriceKey, size: int, tokens: int, geometry: Geometry) -> Quote:
        """The price of a generation whose KV cache may hold `tokens`; `key.bucket` names
        its prompt bucket, whose numeric size (its tokens) is `size`."""
        entry = self._entries.get(key)
        penalty, floor = (entry.penalty, entry.floor) if entry else (1.0, 0)
        expected = entry.expected_s() if entry else DEFAULT_RUN_S
        rate = self._family_rate(key)
        fixed = entry.fixed() if entry else None
        if rate is None and geometry.kv_bytes_per_token <= 0:
            # nothing known: it runs alone once, and its measurement teaches the line
            return Quote(max(geometry.fixed_bytes, floor), True, "unseen", expected, floor)
        per_token = (
            rate * MEASURED_MARGIN
            if rate is not None
            else geometry.kv_bytes_per_token * GEOMETRY_MARGIN
        )
        base = (
            fixed * MEASURED_MARGIN
            if fixed is not None
            else max(geometry.fixed_bytes, self._neighbour_fixed(key, size)) * GEOMETRY_MARGIN
        )
        nbytes = max(math.ceil((base + per_token * tokens) * penalty), floor)
        return Quote(nbytes, False, line_source(rate, fixed), expected, floor)

    def record(self, key: PriceKey, size: int, peak: int, run_s: float) -> None:
        """A peak measured while the job ran alone (a clean sample)."""
        entry = self._entry(key, size)
        entry.peaks.append(max(0, int(peak)))
        entry.run_s.append(run_s)
        entry.clean_run()
        entry.changed()
        self.dirty = True

    def record_run_time(self, key: PriceKey, size: int, run_s: float) -> None:
        """A run that overlapped others: its peak is not its own, its time still counts."""
        entry = self._entry(key, size)
        entry.run_s.append(run_s)
        entry.changed()
        self.dirty = True

    def record_generation(
        self,
        key: PriceKey,
        size: int,
        sample: GenerationSample,
    ) -> None:
        """A finished generation, however it ended. Its KV bytes per token are its own
        (measured on its cache); its peak is its own only if it ran alone (`clean`)."""
        entry = self._entry(key, size, generation=True)
        tokens = max(1, sample.kv_tokens)
        rate = sample.kv_bytes // tokens if sample.kv_bytes > 0 else None
        if sample.clean:
            if rate is None:  # the model cannot tell its cache's size: all of it per token
                rate = math.ceil(sample.peak / tokens)
            entry.peaks.append(max(0, int(sample.peak) - rate * tokens))
            entry.clean_run()
        if rate is not None:
            entry.per_token.append(rate)
        entry.run_s.append(sample.run_s)
        entry.changed()
        self.dirty = True

    def penalize(
        self, key: PriceKey, size: int, *, alone: bool, pool: int, generation: bool = False
    ) -> None:
        """An out-of-memory in this bucket: raise its price."""
        entry = self._entry(key, size, generation)
        entry.ooms += 1
        entry.penalty = min(MAX_PENALTY, entry.penalty * OOM_PENALTY)
        if alone:
            entry.floor = max(entry.floor, pool + 1)
        entry.changed()
        self.dirty = True

    def snapshot(self) -> list[dict[str, Any]]:
        """Every bucket's price and where it came from (a generation bucket shows its
        line: `fixed_bytes` + `per_token_bytes` × the tokens a request may hold)."""
        rows = []
        for key, entry in sorted(self._entries.items(), key=lambda kv: (kv[0].model, kv[1].size)):
            row: dict[str, Any] = {
                "model": key.model,
                "bucket": key.bucket,
                "size": entry.size,
                "device": key.device,
                "dtype": key.dtype,
                "price_bytes": entry.price(),
                "source": "learned" if entry.peaks else "unseen",
                "samples": len(entry.peaks),
                "expected_run_s": round(entry.expected_s(), 6),
                "penalty": round(entry.penalty, 4),
                "ooms": entry.ooms,
            }
            if entry.generation:
                rate, fixed = self._family_rate(key), entry.fixed()
                row["fixed_bytes"] = fixed
                row["per_token_bytes"] = rate
                row["source"] = line_source(rate, fixed)
                row["samples"] = len(entry.run_s)
            rows.append(row)
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
                    "fingerprint": k.fingerprint,
                    "size": e.size,
                    "generation": e.generation,
                    "peaks": list(e.peaks),
                    "per_token": list(e.per_token),
                    "run_s": list(e.run_s),
                    "penalty": e.penalty,
                    "floor": e.floor,
                    "ooms": e.ooms,
                }
                for k, e in self._entries.items()
            ],
        }
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(f".{os.getpid()}.tmp")  # replicas may share the folder
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, self._path)  # atomic: a crash never leaves half a file
        self.dirty = False

    def _load(self, path: Path) -> None:
        if not path.is_file():
            return
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("version") == 1:  # before fingerprints: whose weights is unknown
                log.info("learned prices in %s predate model fingerprints; relearning", path)
                return
            if data.get("version") != FILE_VERSION:
                raise ValueError(f"unknown version {data.get('version')!r}")
            for row in data["entries"]:
                key = PriceKey(
                    row["model"], row["bucket"], row["device"], row["dtype"], row["fingerprint"]
                )
                entry = self._entry(key, int(row["size"]), generation=bool(row["generation"]))
                entry.peaks.extend(int(p) for p in row["peaks"])
                entry.per_token.extend(int(p) for p in row["per_token"])
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
    def _entry(self, key: PriceKey, size: int, generation: bool = False) -> PriceEntry:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = PriceEntry(size=size, generation=generation)
        return entry

    def _family_rate(self, key: PriceKey) -> int | None:
        """The model's measured KV bytes per token: the same in every prompt bucket."""
        rates = [
            rate
            for other, entry in self._entries.items()
            if other.family() == key.family() and (rate := entry.rate()) is not None
        ]
        return max(rates) if rates else None

    def _neighbour_fixed(self, key: PriceKey, size: int) -> int:
        """An unmeasured prompt bucket's fixed part from measured ones of the model: the
        smallest larger one, else the largest smaller one scaled up with a margin (the
        prefill's activations grow with the prompt). 0 when none is measured."""
        larger: list[tuple[int, int]] = []
        smaller: list[tuple[int, int]] = []
        for other, e in self._entries.items():
            fixed = e.fixed() if e.generation else None
            if other == key or other.family() != key.family() or fixed is None:
                continue
            (larger if e.size >= size else smaller).append((e.size, fixed))
        if larger:
            return min(larger)[1]
        if smaller:
            low_size, low_fixed = max(smaller)
            return math.ceil(low_fixed * size / max(low_size, 1) * EXTRAPOLATION_MARGIN)
        return 0

    def _family(self, key: PriceKey) -> list[tuple[int, int, int]]:  # one-shot buckets only
        """(size, price, measured) of the learned buckets of the same model, device and
        dtype."""
        found = []
        for other, entry in self._entries.items():
            price, measured = entry.price(), entry.measured()
            if other != key and other.family() == key.family() and price is not None:
                found.append((entry.size, price, measured or price))
        return found

    def _neighbours(self, key: PriceKey, size: int) -> tuple[int | None, tuple[int, int] | None]:
        """The smallest larger neighbour's price (an upper bound as it is), and the
        largest smaller one's size and measured bytes (to extrapolate from)."""
        family = self._family(key)
        larger = [price for s, price, _ in family if s >= size]
        smaller = [(s, measured) for s, _, measured in family if s < size]
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


class LoadLedger:
    """What a model's loads measured, by the settings that size them (for a GGUF: its
    context, slots, KV type and layers on the device), kept in the book with the prices
    (as the bucket `load:...` of the model's weights on this device) and used from the
    next load on instead of the estimate. Pure: the book persists it."""

    def __init__(self, book: BudgetBook, device_key: str) -> None:
        self._book = book
        self._device_key = device_key

    def _key(self, model: str, dtype: str, fingerprint: str, config: str) -> PriceKey:
        return PriceKey(model, f"load:{config}", self._device_key, dtype, fingerprint)

    def learned(self, model: str, dtype: str, fingerprint: str, config: str) -> int | None:
        """The P95 of the bytes such loads measured; None before one was measured. No
        allowance for a spread (as a job's price from few samples has): the buffers a
        load's log reports are the same for the same settings."""
        entry = self._book._entries.get(self._key(model, dtype, fingerprint, config))
        return entry.measured() if entry is not None else None

    def record(
        self, model: str, dtype: str, fingerprint: str, config: str, nbytes: int, load_s: float
    ) -> None:
        self._book.record(self._key(model, dtype, fingerprint, config), 0, nbytes, load_s)
