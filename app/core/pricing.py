"""The pricer: where a job's price is kept, what it is now, the bytes and exclusivity it
is admitted with, and what each run teaches. It reads the book and the device's
capacity; it never calls the scheduler."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.core.work import Job
from app.devices.executor import Measurement
from app.models.base import ModelHandler
from app.models.decoding import DecodeResult
from app.models.prepared import Prepared
from app.sched.budget import BudgetBook, GenerationSample, PriceKey, Quote


def price_size(prepared: Prepared) -> int:
    """The numeric size of the bucket a price is kept under (see `Pricer.key`)."""
    return prepared.kv_bound[0] if prepared.kv_bound else prepared.bucket.size


class Pricer:
    def __init__(self, book: BudgetBook, device_key: str, capacity: Callable[[], int]) -> None:
        self.book = book
        self._device_key = device_key  # in every price key: read once
        self._capacity = capacity

    def key(self, model: str, handler: ModelHandler, prepared: Prepared) -> PriceKey:
        """Where the book keeps the price: the bucket, or a generation's prompt bucket
        (its line's tokens are the request's own), on these weights on this device."""
        bucket = f"p{prepared.kv_bound[0]}" if prepared.kv_bound else prepared.bucket.label
        bucket += prepared.price_tag
        return PriceKey(model, bucket, self._device_key, handler.dtype, handler.fingerprint)

    def quote(self, handler: ModelHandler, key: PriceKey, prepared: Prepared) -> Quote:
        if handler.requests_reserved:  # held within its model's reservation
            return self.book.quote_reserved(key)._replace(held=handler.held_bytes(prepared))
        if prepared.kv_bound is not None:  # a generation, by its KV
            prompt, tokens = prepared.kv_bound
            geometry = handler.kv_geometry(prompt)
            assert geometry is not None, "a generation's model prices its KV"
            return self.book.quote_generation(key, prompt, tokens, geometry)
        return self.book.quote(key, prepared.bucket.size, handler.prior_bytes(prepared.bucket))

    def capacity(self) -> int:
        """The most bytes the device's pool can ever give one job."""
        return self._capacity()

    def admission(self, quote: Quote) -> tuple[int, bool]:
        """The bytes and exclusivity a quote is admitted with. An exclusive price is a
        guess: it runs alone whatever it says, unless proven too big for the device. A
        price that penalties raised above the device, for a bucket never proven too big
        (its floor fits), also runs alone rather than being refused for good."""
        capacity = self._capacity()
        if quote.exclusive or (quote.nbytes > capacity >= quote.floor):
            return max(min(quote.nbytes, capacity), quote.floor), True
        return quote.nbytes, False

    # -- groups ----------------------------------------------------------------------
    def group(self, jobs: Sequence[Job]) -> tuple[Prepared, PriceKey] | None:
        """Several one-shot jobs of one model as one forward: the merged input and its
        key (the leader's, with the group's own bucket), or None if they cannot merge."""
        leader = jobs[0]
        handler = leader.handler
        if len(jobs) == 1:
            return leader.prepared, leader.key
        merged = handler.merge([job.prepared for job in jobs])
        if merged is None:
            return None
        key = leader.key
        if merged.bucket.label != key.bucket:  # built directly: replace() costs more
            key = PriceKey(
                leader.model, merged.bucket.label, key.device, key.dtype, key.fingerprint
            )
        return merged, key

    def group_admission(self, jobs: Sequence[Job]) -> tuple[int, bool] | None:
        """What a would-be group is admitted with, or None if it cannot be one. A group
        whose price is past the whole device is none: one request alone runs on a guess
        that big (a measurement decides), a batch of them would rather run smaller."""
        grouped = self.group(jobs)
        if grouped is None:
            return None
        merged, key = grouped
        quote = self.quote(jobs[0].handler, key, merged)
        if len(jobs) > 1 and max(quote.nbytes, quote.floor) > self._capacity():
            return None
        return self.admission(quote)

    # -- learning --------------------------------------------------------------------
    def record(self, key: PriceKey, prepared: Prepared, measurement: Measurement) -> None:
        if measurement.alone:
            self.book.record(key, prepared.bucket.size, measurement.peak_bytes, measurement.run_s)
        else:
            self.book.record_run_time(key, prepared.bucket.size, measurement.run_s)

    def record_generation(
        self, key: PriceKey, prepared: Prepared, outcome: DecodeResult, measurement: Measurement
    ) -> None:
        """Every finished generation teaches its model's line, however it ended: its KV
        bytes per token (its own cache, measured even beside others) and, when it ran
        alone, the fixed part of its peak. One priced as a plain bucket (a simulated
        model holding its bucket's bytes throughout) teaches that bucket."""
        if prepared.kv_bound is None:
            self.record(key, prepared, measurement)
            return
        sample = GenerationSample(
            outcome.kv_tokens,
            outcome.kv_bytes,
            measurement.peak_bytes,
            measurement.run_s,
            measurement.alone,
        )
        self.book.record_generation(key, price_size(prepared), sample)

    def penalize(self, key: PriceKey, prepared: Prepared, *, alone: bool, pool: int) -> None:
        """An out-of-memory run: its price goes up (see BudgetBook.penalize)."""
        self.book.penalize(
            key,
            price_size(prepared),
            alone=alone,
            pool=pool,
            generation=prepared.kv_bound is not None,
        )
