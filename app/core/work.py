"""Work and what it gives back: a queued `Job`, a run's `JobResult`, a request's `Cost`,
a one-shot `InferenceResult`, and an `AdmittedGeneration` to stream from."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from app.core.overflow import HEADER as TRUNCATED_HEADER
from app.core.overflow import Truncation
from app.devices.executor import Measurement
from app.errors import VramgateError
from app.models.base import ModelHandler
from app.models.decoding import DecodeResult, TokenStream
from app.models.prepared import Prepared
from app.sched.budget import PriceKey, Quote
from app.sched.priority import Priority

log = logging.getLogger("vramgate.service")

# a request's class, said on every answer and asked by clients that can set no field
PRIORITY_HEADER = "X-Vramgate-Priority"


@dataclass(frozen=True)
class JobResult:
    output: Any  # embedding rows (np.ndarray), per-image outputs, or a DecodeResult
    measurement: Measurement
    bucket: str  # the group's bucket
    price_bytes: int  # what the group was admitted with
    batch: int  # requests in the group


@dataclass(eq=False)
class Job:
    """A priced request: a one-shot model's input, or a generation with its `stream`."""

    model: str
    handler: ModelHandler
    prepared: Prepared
    key: PriceKey
    quote: Quote
    result: asyncio.Future[JobResult]
    stream: TokenStream | None = None  # a generation: its text flows here while it runs
    waited_s: float = 0.0  # waiting for its model and in the queue, once admitted
    device: str = ""  # the id of the device it runs on
    priority: Priority = Priority.INTERACTIVE  # its class in the queue (app.core.priority)

    @property
    def label(self) -> str:
        """The bucket as callers see it (a generation's: prompt and token bound)."""
        return self.prepared.bucket.label


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
    device: str = ""  # the id of the device it ran on
    truncated: Truncation | None = None  # turns dropped from its chat's middle to fit
    priority: Priority = Priority.INTERACTIVE  # the class it was queued in

    @staticmethod
    def combined(costs: list[Cost]) -> Cost:
        """Several streams of one request (its `n` choices): their prices and peaks add
        up; the wait and run are the longest; the bucket and source are the first's."""
        first = costs[0]
        return Cost(
            first.bucket,
            sum(c.price_bytes for c in costs),
            first.price_source,
            max(c.queue_s for c in costs),
            max(c.run_s for c in costs),
            sum(c.peak_bytes for c in costs),
            max(c.batch for c in costs),
            ",".join(dict.fromkeys(c.device for c in costs)),
            first.truncated,
            first.priority,
        )

    def headers(self) -> dict[str, str]:
        said = {TRUNCATED_HEADER: self.truncated.header()} if self.truncated else {}
        return {
            **said,
            "X-Vramgate-Bucket": self.bucket,
            "X-Vramgate-Price-Bytes": str(self.price_bytes),
            "X-Vramgate-Price-Source": self.price_source,
            "X-Vramgate-Queue-Ms": f"{self.queue_s * 1000:.1f}",
            "X-Vramgate-Run-Ms": f"{self.run_s * 1000:.1f}",
            "X-Vramgate-Batch": str(self.batch),
            "X-Vramgate-Device": self.device,
            PRIORITY_HEADER: self.priority.label,
        }


def cost_of(result: JobResult, job: Job) -> Cost:
    """What `job` cost. Its price source says `+tiled` where its images were decoded in
    tiles to fit (its bucket's `~tiled` variant: app.models.image_buckets)."""
    measurement = result.measurement
    tiled = result.bucket.endswith("~tiled")
    return Cost(
        result.bucket,
        result.price_bytes,
        f"{job.quote.source}+tiled" if tiled else job.quote.source,
        job.waited_s,
        measurement.run_s,
        measurement.peak_bytes,
        result.batch,
        job.device,
        priority=job.priority,
    )


@dataclass(frozen=True)
class InferenceResult:
    """A one-shot request's answer: embedding rows (np.ndarray) or per-image outputs."""

    output: Any
    tokens: int
    cost: Cost
    warnings: tuple[str, ...] = ()  # what the answer tells of its request (a prompt cut)


class AdmittedGeneration:
    """A generation that holds its permit and runs: its text as it is decoded, then its
    outcome and cost. Whoever holds one must `close()` it: one closed early stops before
    its next step, and its permit comes back when the device is done with it."""

    def __init__(self, job: Job, stream: TokenStream, truncated: Truncation | None = None) -> None:
        self.job = job
        self.stream = stream
        self.truncated = truncated  # turns dropped from its chat's middle to fit

    @staticmethod
    def admission_headers(generations: list[AdmittedGeneration]) -> dict[str, str]:
        """What is known when streams start: the bucket, the price and the wait. Several
        streams of one request (its `n` choices): their prices add up, the wait is the
        longest, bucket and source are the first's (as `Cost.combined`)."""
        first = generations[0].job
        truncated = generations[0].truncated
        said = {TRUNCATED_HEADER: truncated.header()} if truncated is not None else {}
        return {
            **said,
            "X-Vramgate-Bucket": first.label,
            "X-Vramgate-Price-Bytes": str(
                sum(g.job.quote.nbytes or g.job.quote.held for g in generations)
            ),
            "X-Vramgate-Price-Source": first.quote.source,
            "X-Vramgate-Queue-Ms": f"{max(g.job.waited_s for g in generations) * 1000:.1f}",
            "X-Vramgate-Device": ",".join(dict.fromkeys(g.job.device for g in generations)),
            PRIORITY_HEADER: first.priority.label,
        }

    async def deltas(self) -> AsyncIterator[str]:
        while (delta := await self.stream.deltas.get()) is not None:
            yield delta

    async def outcome(self) -> tuple[DecodeResult, Cost]:
        """After `deltas` ran out: the outcome, or the error that ended the generation."""
        result = await self.job.result
        output = result.output
        cost = cost_of(result, self.job)
        if self.truncated is not None:
            gone = self.truncated
            output = replace(output, dropped_messages=gone.messages, dropped_tokens=gone.tokens)
            cost = replace(cost, truncated=gone)
        return output, cost

    def close(self) -> None:
        if not self.job.result.done():
            self.stream.cancel()


def log_refusal(error: VramgateError, where: str) -> None:
    """One line per refusal or failure that no request line says (`where`: the model,
    or the route), warned of when it is the server's."""
    level = logging.WARNING if error.status >= 500 else logging.INFO
    log.log(level, "refused %s: %d %s: %s", where, error.status, error.code, error.message)


def log_request(job: Job, result: JobResult | None, outcome: str) -> None:
    """One line per request. A request that ran in a batch shows the batch's bucket,
    price and size; its peak is the batch's, measured when it ran alone."""
    measurement = result.measurement if result else None
    peak = measurement.peak_bytes if measurement and measurement.alone else None
    log.info(
        "request model=%s bucket=%s price=%d%s batch=%d queue_ms=%.1f run_ms=%.1f "
        "peak=%s outcome=%s class=%s",
        job.model,
        result.bucket if result else job.label,
        result.price_bytes if result else job.quote.nbytes,
        " exclusive" if job.quote.exclusive else "",
        result.batch if result else 1,
        job.waited_s * 1000,
        measurement.run_s * 1000 if measurement else 0.0,
        peak if peak is not None else "-",
        outcome,
        job.priority.label,
    )
