"""What a request gets back from the service: its cost, a one-shot result, or an
admitted generation to stream from."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from app.jobs import Job
from app.models.textgen import GenerationOutcome, TokenStream


@dataclass(frozen=True)
class Cost:
    """What a request cost; sent back in headers and `usage`."""

    bucket: str
    price_bytes: int
    price_source: str
    queue_s: float
    run_s: float
    peak_bytes: int
    batch: int = 1  # requests that ran together in one forward, this one included

    def headers(self) -> dict[str, str]:
        return {
            "X-Vramgate-Bucket": self.bucket,
            "X-Vramgate-Price-Bytes": str(self.price_bytes),
            "X-Vramgate-Price-Source": self.price_source,
            "X-Vramgate-Queue-Ms": f"{self.queue_s * 1000:.1f}",
            "X-Vramgate-Run-Ms": f"{self.run_s * 1000:.1f}",
            "X-Vramgate-Batch": str(self.batch),
        }


@dataclass(frozen=True)
class InferenceResult:
    """A one-shot request's answer: embedding rows (np.ndarray) or per-image outputs."""

    output: Any
    tokens: int
    cost: Cost


class Generation:
    """An admitted generation: its text as it is decoded, then its outcome and cost.
    Whoever holds one must `close()` it: a generation closed early stops before its next
    step, and its permit comes back when the device is done with it."""

    def __init__(self, job: Job, stream: TokenStream, waited: float) -> None:
        self.job = job
        self.stream = stream
        self.waited = waited

    def admission_headers(self) -> dict[str, str]:
        """What is known when the stream starts: the bucket, the price and the wait."""
        quote = self.job.quote
        return {
            "X-Vramgate-Bucket": self.job.label,
            "X-Vramgate-Price-Bytes": str(quote.nbytes),
            "X-Vramgate-Price-Source": quote.source,
            "X-Vramgate-Queue-Ms": f"{self.waited * 1000:.1f}",
        }

    async def deltas(self) -> AsyncIterator[str]:
        while (delta := await self.stream.deltas.get()) is not None:
            yield delta

    async def outcome(self) -> tuple[GenerationOutcome, Cost]:
        """After `deltas` ran out: the outcome, or the error that ended the generation."""
        result = await self.job.result
        measurement = result.measurement
        cost = Cost(
            result.bucket,
            result.price_bytes,
            self.job.quote.source,
            self.waited,
            measurement.run_s,
            measurement.peak_bytes,
        )
        return result.output, cost

    def close(self) -> None:
        if not self.job.result.done():
            self.stream.cancel()
