"""Jobs and continuous batching.

A request becomes a `Job` waiting in the MemoryGate. When the gate admits it, it may
bring along the waiting jobs of the same model behind it (a group), priced by the
group's own bucket so admission still holds. The `JobRunner` runs each admitted group
as one forward on the inference pool, releases its permit when the device is done,
records the group's measured peak, and hands every member its rows.

Everything here runs on the event loop thread, except the forward itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from app.engine.executor import Measurement
from app.errors import RunTimeout, VramgateError
from app.models.base import ModelHandler, Prepared
from app.models.textgen import TokenStream
from app.sched.budget import PriceKey, Quote
from app.sched.gate import Permit, Ticket

if TYPE_CHECKING:
    from app.service import InferenceService

log = logging.getLogger("vramgate.jobs")


@dataclass(frozen=True)
class JobResult:
    output: Any  # embedding rows (np.ndarray), or a generation's GenerationOutcome
    measurement: Measurement
    bucket: str  # the group's bucket
    price_bytes: int  # what the group was admitted with
    batch: int  # requests in the group


@dataclass
class Job:
    model: str
    handler: ModelHandler
    prepared: Prepared
    key: PriceKey
    quote: Quote
    result: asyncio.Future[JobResult]
    stream: TokenStream | None = None  # a generation: its text flows here while it runs
    waited_s: float = 0.0  # from queueing to admission, once admitted

    @property
    def label(self) -> str:
        """The bucket as callers see it (a generation's: prompt and token bound)."""
        return self.prepared.bucket.label


FailureMapper = Callable[[BaseException, PriceKey, Prepared, Permit], VramgateError]


def split_rows(output: Any, jobs: list[Job]) -> list[Any]:
    """A group's output (an array or a list, one row per input) back to its members."""
    counts = [job.prepared.count for job in jobs]
    if isinstance(output, np.ndarray):
        return list(np.split(output, np.cumsum(counts)[:-1]))
    ends = np.cumsum(counts).tolist()
    return [output[end - count : end] for end, count in zip(ends, counts, strict=True)]


@dataclass
class Running:
    """A group on the device, as the watchdog sees it."""

    permit: Permit
    jobs: list[Job]
    started_at: float
    released: bool = False
    overdue: bool = False

    def progress_at(self) -> float:
        """When it last showed life: its start, or a stream's latest text."""
        stream = self.jobs[0].stream
        return max(self.started_at, stream.progress_at if stream is not None else 0.0)


class JobRunner:
    def __init__(self, service: InferenceService, on_failure: FailureMapper) -> None:
        self.service = service
        self.on_failure = on_failure
        self.jobs: dict[int, Job] = {}  # waiting jobs by ticket id
        self.running: dict[int, Running] = {}  # groups on the device, by permit
        self.wedged = 0  # overdue groups whose thread has not come back yet
        self._tasks: set[asyncio.Task[None]] = set()

    def key_for(self, job: Job, prepared: Prepared) -> PriceKey:
        """A merged group's key: the leader's, with the group's own bucket (built
        directly: dataclasses.replace costs several times as much, once per batch)."""
        key = job.key
        if prepared.bucket.label == key.bucket:
            return key
        return PriceKey(job.model, prepared.bucket.label, key.device, key.dtype, key.fingerprint)

    def price_group(self, tickets: Sequence[Ticket]) -> tuple[int, bool] | None:
        """The gate's group pricer: the merged request's quote, or None if unmergeable."""
        jobs = [self.jobs.get(t.id) for t in tickets]
        if any(job is None for job in jobs):
            return None
        leader = jobs[0]
        assert leader is not None
        merged = leader.handler.merge([job.prepared for job in jobs if job is not None])
        if merged is None:
            return None
        quote = self.service.quote(leader.handler, self.key_for(leader, merged), merged)
        return self.service.admission(quote)

    def start(self, permit: Permit) -> None:
        """Run an admitted group; called once per permit, by its leader's admission."""
        members = permit.members or (permit.ticket_id,)
        jobs = [job for tid in members if (job := self.jobs.pop(tid, None)) is not None]
        if not jobs:  # everyone left before the group started
            self.service.release(permit)
            return
        task = asyncio.get_running_loop().create_task(self._run(permit, jobs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _track(self, permit: Permit, jobs: list[Job], work: asyncio.Future[Any]) -> Running:
        """The permit's bytes stay taken until the device is really done with the group,
        or until the watchdog gives up on it."""
        run = Running(permit, jobs, self.service.clock())
        self.running[permit.ticket_id] = run

        def done(_: asyncio.Future[Any]) -> None:
            self.running.pop(permit.ticket_id, None)
            if run.overdue:
                self.wedged -= 1
                log.warning(
                    "an overdue job came back after %.1fs", self.service.clock() - run.started_at
                )
            self._release(run)

        work.add_done_callback(done)
        return run

    def _release(self, run: Running) -> None:
        if not run.released:
            run.released = True
            self.service.release(run.permit)

    def watch(self, now: float, limit_s: float) -> int:
        """Fail the groups that showed no life for `limit_s` (504) and give their permits
        back: the device memory they may still hold stays out of the pool, which follows
        the device live. Their threads count as wedged until they return."""
        overdue = 0
        for run in list(self.running.values()):
            if run.overdue or now - run.progress_at() <= limit_s:
                continue
            run.overdue = True
            self.wedged += 1
            overdue += 1
            error = RunTimeout(
                f"the model showed no progress for {limit_s:g}s; the request was abandoned",
                retry_after=max(1.0, limit_s),
            )
            for job in run.jobs:
                if not job.result.done():
                    job.result.set_exception(error)
                if job.stream is not None:
                    job.stream.cancel()
                    job.stream.close()
            self._release(run)
            log.error("job %s overdue after %.1fs", run.jobs[0].key.bucket, limit_s)
        return overdue

    async def _run(self, permit: Permit, jobs: list[Job]) -> None:
        leader = jobs[0]
        if leader.stream is not None:
            await self._run_stream(permit, leader, leader.stream)
            return
        merged = leader.handler.merge([job.prepared for job in jobs]) or leader.prepared
        key = self.key_for(leader, merged)
        executor = self.service.executor
        work = executor.submit_device(leader.handler.forward, merged)
        run = self._track(permit, jobs, work)
        try:
            raw, measurement = await asyncio.shield(work)
            if leader.handler.postprocess_on_loop:
                output = leader.handler.postprocess(raw)
            else:
                output = await self.service.executor.run_cpu(leader.handler.postprocess, raw)
        except Exception as exc:
            error = self.on_failure(exc, key, merged, permit)
            for job in jobs:
                if not job.result.done():
                    job.result.set_exception(error)
            return
        if not run.overdue:  # a late run's time and peak say nothing about its bucket
            self.service.record(key, merged, measurement)
        for job, rows in zip(jobs, split_rows(output, jobs), strict=True):
            if not job.result.done():
                job.result.set_result(
                    JobResult(rows, measurement, merged.bucket.label, permit.nbytes, len(jobs))
                )

    async def _run_stream(self, permit: Permit, job: Job, stream: TokenStream) -> None:
        """A generation runs alone in its group and holds its permit until it returns."""
        work = self.service.executor.submit_device(
            job.handler.generate, job.prepared, stream, stream=True
        )
        run = self._track(permit, [job], work)
        try:
            outcome, measurement = await asyncio.shield(work)
        except Exception as exc:
            error = self.on_failure(exc, job.key, job.prepared, permit)
            if not job.result.done():
                job.result.set_exception(error)
            stream.close()
            return
        if not run.overdue:
            self.service.record_generation(job.key, job.prepared, outcome, measurement)
        if not job.result.done():
            job.result.set_result(
                JobResult(outcome, measurement, job.prepared.bucket.label, permit.nbytes, 1)
            )
        stream.close()

    def cancel_streams(self, model: str | None = None, reason: Exception | None = None) -> None:
        """Stop running generations (of `model`, or all) before their next step."""
        for run in self.running.values():
            for job in run.jobs:
                if job.stream is not None and model in (None, job.model):
                    job.stream.cancel(reason)

    def running_for(self, model: str) -> int:
        """Groups of `model` still on the device (their threads not yet back)."""
        return sum(1 for run in self.running.values() if run.jobs[0].model == model)

    async def stop(self, timeout_s: float) -> None:
        """Let running groups hand out their results, for at most `timeout_s`."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout_s)
