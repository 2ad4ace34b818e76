"""Running admitted work on the executor: a group of one-shot jobs as one forward, or a
generation stream, and handing each member its result. Knows nothing of the queue: the
scheduler launches a run, watches its device work end, and releases its permit."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.core.failures import FailureMapper
from app.core.prefill import PrefillClock
from app.core.pricing import Pricer
from app.core.work import Job, JobResult
from app.devices.executor import Executor, Measurement
from app.models.decoding import DecodeResult
from app.models.prepared import Prepared
from app.sched.budget import PriceKey
from app.sched.tickets import Permit

log = logging.getLogger("vramgate.jobs")


@dataclass(eq=False)
class Running:
    """A group on the device, as the scheduler and the watchdog see it."""

    permit: Permit
    jobs: list[Job]
    started_at: float
    work: asyncio.Future[tuple[Any, Measurement]]  # resolves when the device is done
    merged: Prepared  # what ran: the group's merged input, or the stream's own
    key: PriceKey  # where its measurement is recorded
    released: bool = False  # its permit is back in the gate
    overdue: bool = False  # the watchdog gave up on it
    ended: bool = False  # and its engine ended its silent process: nothing of ours wedged
    ended_error: Exception | None = None  # what its requests are told then
    # what its failed device work tells its requests, mapped when the device came back
    # (before its permit: an out-of-memory's raised price is in place for what waits)
    failure: Exception | None = None
    # its start on the streams' clock (monotonic; the scheduler's may be a test's)
    began: float = field(default_factory=time.monotonic)

    def progress_at(self) -> float:
        """When it last showed life: its start, a stream's latest text, or a step its
        model reported (a job of many steps beats; with several jobs of one model on the
        device at once, any one's beat counts for all: the watchdog is for wedged threads,
        which beat for none)."""
        stream = self.jobs[0].stream
        beat = self.jobs[0].handler.progress_at
        return max(self.started_at, stream.progress_at if stream is not None else 0.0, beat)


def split_rows(output: Any, jobs: list[Job]) -> list[Any]:
    """A group's output (an array or a list, one row per input) back to its members."""
    counts = [job.prepared.count for job in jobs]
    if isinstance(output, np.ndarray):
        return list(np.split(output, np.cumsum(counts)[:-1]))
    ends = np.cumsum(counts).tolist()
    return [output[end - count : end] for end, count in zip(ends, counts, strict=True)]


class GroupRunner:
    def __init__(
        self,
        executor: Executor,
        pricer: Pricer,
        failures: FailureMapper,
        wait_s: Callable[[], float],
        clock: Callable[[], float],
        prefills: PrefillClock,
    ) -> None:
        """`wait_s`: the queue's estimated wait, the retry hint of an out-of-memory run.
        `prefills` learns each stream's prefill time."""
        self._executor = executor
        self._pricer = pricer
        self._failures = failures
        self._wait_s = wait_s
        self._clock = clock
        self._prefills = prefills

    def launch(self, permit: Permit, jobs: list[Job]) -> Running:
        """Start an admitted group's device work now; `settle` hands out its results."""
        leader = jobs[0]
        if leader.stream is not None:  # a stream runs alone
            merged, key = leader.prepared, leader.key
        else:
            merged, key = self._pricer.group(jobs) or (leader.prepared, leader.key)
        # where the work runs (our device threads, or awaited from a runner process) is
        # the model's engine's (app.models.stages)
        work = leader.handler.start(merged, leader.stream, self._executor)
        return Running(permit, jobs, self._clock(), work, merged, key)

    def device_failed(self, run: Running) -> Exception | None:
        """Where the run's device work failed: its error as callers see it, mapped now
        (an out-of-memory's price raised) and kept for `settle`; None otherwise."""
        work = run.work
        if run.failure is None and work.done() and not work.cancelled():
            exc = work.exception()
            if isinstance(exc, Exception):
                run.failure = self._failures(exc, run.key, run.merged, run.permit, self._wait_s())
        return run.failure

    async def settle(self, run: Running) -> None:
        """Wait for the run's device work, record what it measured, and give every member
        its result (or the error that ended it)."""
        leader = run.jobs[0]
        try:
            try:
                raw, measurement = await asyncio.shield(run.work)
            except asyncio.CancelledError:
                if not run.work.cancelled() or run.ended_error is None:
                    raise  # this settle itself was cancelled (a stop)
                raise run.ended_error from None
            if leader.stream is None:  # a stream's output is its outcome
                raw = await leader.handler.finish(raw, self._executor)
            output = raw
        except Exception as exc:
            error = run.failure
            if error is None:  # not the device work's own failure (its finish's)
                error = self._failures(exc, run.key, run.merged, run.permit, self._wait_s())
            for job in run.jobs:
                if not job.result.done():
                    job.result.set_exception(error)
            self._close_stream(leader)
            return
        if leader.stream is not None:
            if not run.overdue:  # a late run's time and peak say nothing about its bucket
                self._pricer.record_generation(run.key, run.merged, output, measurement)
                self._record_prefill(run, output)
            rows = [output]
        else:
            if not run.overdue:
                self._pricer.record(run.key, run.merged, measurement)
            rows = split_rows(output, run.jobs)
        # a reserved request's price is what it holds of its model's reservation
        price = run.permit.nbytes or sum(job.quote.held for job in run.jobs)
        bucket, size = run.merged.bucket.label, len(run.jobs)
        for job, row in zip(run.jobs, rows, strict=True):
            if not job.result.done():
                job.result.set_result(JobResult(row, measurement, bucket, price, size))
        self._close_stream(leader)

    def _record_prefill(self, run: Running, output: Any) -> None:
        """A stream's time from its start to its first step, over the prompt tokens it
        computed (those its prefix cache held cost nothing)."""
        first = run.jobs[0].stream.first_step_at if run.jobs[0].stream else 0.0
        if first and isinstance(output, DecodeResult):
            computed = output.prompt_tokens - output.cached_tokens
            self._prefills.record(run.jobs[0].model, computed, first - run.began)

    @staticmethod
    def _close_stream(job: Job) -> None:
        if job.stream is not None:
            job.stream.close()
