"""The scheduler: the one owner of the queue's state.

It holds the gate (bytes and slots), every ticket's entry from submission until its
device work is done (the job, what its caller waits on, the run it is part of), and the
tasks that hand out results. It is built from narrow collaborators: a pricer (prices and
group prices, which the gate is given for its batching decisions), the executor, a
failure mapper and a clock; nothing it calls calls it back. A gate call returns the
permits it started, and the scheduler launches their work once the call has returned; a
run whose device work ends is an event (a done-callback on the loop) that releases its
permit and launches what that admits.

Everything here runs on the event loop thread; only the device work runs elsewhere.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.config.settings import Settings
from app.core.failures import FailureMapper, queue_timeout, rejection
from app.core.prefill import PrefillClock, Prefilling
from app.core.pricing import Pricer
from app.core.runs import GroupRunner, Running
from app.core.watch import ClientWatch
from app.core.work import Job
from app.devices.executor import Executor
from app.errors import (
    ClientGone,
    ContextLengthExceeded,
    OutOfMemory,
    RunnerStopped,
    RunTimeout,
    VramgateError,
)
from app.models.prefix_cache import PrefixStore
from app.sched.budget import PriceKey
from app.sched.gate import MemoryGate
from app.sched.tickets import Permit, Reject, Ticket, Wait

log = logging.getLogger("vramgate.jobs")

WATCH_AFTER_S = 0.25  # a waiting request's disconnect watch starts after this long


@dataclass(frozen=True)
class Limits:
    """The queue's settings."""

    queue_timeout: float
    max_queue: int
    max_head_bypass: int = 16
    batch_wait_s: float = 0.0
    aging_s: float = 60.0  # background work's longest wait before it is interactive
    step_aside: bool = True  # background waits while interactive work runs or waits
    single_after_s: float = 0.0  # then runs one at a time for this long

    @classmethod
    def of(cls, settings: Settings, device_kind: str = "cpu") -> Limits:
        batch_wait_s = settings.max_batch_wait_ms / 1000
        single = settings.background_single_after_s
        if single is None:  # a CPU's steps share its cores: measured in bench/priority.py
            single = 30.0 if device_kind == "cpu" else 0.0
        return cls(
            settings.queue_timeout,
            settings.max_queue,
            settings.max_head_bypass,
            batch_wait_s,
            settings.background_aging_s,
            settings.background_steps_aside,
            single,
        )


@dataclass(eq=False)
class Entry:
    """A ticket's state, from submission until its device work is done. `done` is what
    its caller awaits: the permit (a stream, a load), or the job's result (one-shot)."""

    ticket: Ticket
    job: Job | None  # None: a model load
    done: asyncio.Future[Any]
    run: Running | None = field(default=None, repr=False)


def _price_tickets(pricer: Pricer, tickets: Sequence[Ticket]) -> tuple[int, bool] | None:
    """The gate's group pricer: what the tickets' jobs are admitted with as one group."""
    return pricer.group_admission([ticket.payload for ticket in tickets])


class Scheduler:
    def __init__(
        self,
        *,
        pool: Callable[[], int],
        capacity: Callable[[], int],
        pricer: Pricer,
        executor: Executor,
        failures: FailureMapper,
        limits: Limits,
        clock: Callable[[], float],
        store: PrefixStore | None = None,
    ) -> None:
        """`store`: the device's prefix cache, kept within what no permit holds."""
        self._pricer = pricer
        self._store = store
        self._limits = limits
        self._clock = clock
        self.gate = MemoryGate(
            pool=pool,
            capacity=capacity,
            slots=executor.slots,
            stream_slots=executor.stream_slots,
            max_queue=limits.max_queue,
            clock=clock,
            max_head_bypass=limits.max_head_bypass,
            price_group=functools.partial(_price_tickets, pricer),
            batch_wait_s=limits.batch_wait_s,
            aging_s=limits.aging_s,
            step_aside=limits.step_aside,
            single_after_s=limits.single_after_s,
        )
        self.prefills = PrefillClock()
        self._runner = GroupRunner(
            executor, pricer, failures, self.estimated_wait_s, clock, self.prefills
        )
        self._entries: dict[int, Entry] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.wedged = 0  # overdue runs whose thread has not come back yet

    # -- the front: submit and wait --------------------------------------------------
    async def run(self, job: Job, watch: ClientWatch | None, *, probe: bool = False) -> None:
        """A one-shot job: queue it, wait for admission and then for `job.result`. One
        wait and one wake-up; raises what ended it (refusal, deadline, client gone)."""
        await self._submit(job, job.result, watch, probe)

    async def start(
        self, job: Job, watch: ClientWatch | None = None, *, probe: bool = False
    ) -> None:
        """A stream: returns once it is admitted and runs; `job.result` resolves at its end."""
        await self._submit(job, asyncio.get_running_loop().create_future(), watch, probe)

    async def admit_load(self, label: str, nbytes: int) -> Permit:
        """Wait until the gate admits a model load of `nbytes` (its weights): a load takes
        memory like a job, so it waits for room like one. The caller releases the permit
        (`release`) when the load is done. The caller checks that it can ever fit (other
        models' weights may be unloaded to make room: app.core.lifecycle.lifecycle); raises
        QueueTimeout when no room came in time."""
        ticket = Ticket(
            nbytes=nbytes,
            deadline=self._clock() + self._limits.queue_timeout,
            expected_s=1.0,
            label=f"{label}/load",
            owner=label,
            typical=False,  # a load's bytes are no request's: they size no reserve
        )
        entry = Entry(ticket, None, asyncio.get_running_loop().create_future())
        await self._enter(entry, None, ignore_queue_limit=True)
        return entry.done.result()  # type: ignore[no-any-return]

    def prefer(self, full: Job, lean: Job) -> Job:
        """Of two ways to run one request (`lean`: in fewer bytes, more slowly, as an
        image decoded in tiles), the lean one when the full price can never fit the
        device (a learned one: when even the peak it ran in cannot), or cannot start now
        while the lean one can; else the full one. Now: the
        bytes no permit holds, and no other job running beside one that must run alone."""
        capacity = self._pricer.capacity()
        need = max(full.quote.nbytes, full.quote.floor)
        if full.quote.ran_in:  # it ran in this much: a margin above it is no proof
            need = min(need, max(full.quote.ran_in, full.quote.floor))
        if need > capacity:
            return lean if max(lean.quote.nbytes, lean.quote.floor) <= capacity else full
        free, running = self.gate.free_bytes(), self.gate.running

        def starts_now(job: Job) -> bool:
            nbytes, alone = self._pricer.admission(job.quote)
            return nbytes <= free and not (alone and running)

        return lean if not starts_now(full) and starts_now(lean) else full

    async def _submit(
        self, job: Job, done: asyncio.Future[Any], watch: ClientWatch | None, probe: bool
    ) -> None:
        nbytes, exclusive = self._pricer.admission(job.quote)
        cells = job.handler.cell_capacity
        self.gate.set_cells(job.model, cells)  # the loaded handler's: a reload may change it
        needs = job.handler.cells_for(job.prepared) if cells else 0
        if cells is not None and needs > cells:  # a reload gave it a smaller pool: never
            prompt = job.prepared.tokens
            raise ContextLengthExceeded(
                context=cells,
                prompt=prompt,
                max_tokens=needs - prompt,
                advice=f"(model {job.model!r} now holds {cells} tokens in all: ask for fewer)",
                param="max_tokens",
            )
        ticket = Ticket(
            nbytes=nbytes,
            deadline=self._clock() + self._limits.queue_timeout,
            expected_s=job.quote.expected_s,
            exclusive=exclusive,
            label=f"{job.model}/{job.label}",
            batch_key=batch_key(job),
            stream=job.stream is not None,
            batch_limit=job.handler.spec.max_batch,
            owner=job.model,
            payload=job,
            cells=needs,
            cell_pool=job.model,
            priority=job.priority,
        )
        await self._enter(Entry(ticket, job, done), watch, ignore_queue_limit=probe)

    async def _enter(
        self, entry: Entry, watch: ClientWatch | None, *, ignore_queue_limit: bool
    ) -> None:
        ticket = entry.ticket
        ticket.id = self.gate.next_id()
        self._entries[ticket.id] = entry
        try:
            decision = self.gate.submit(
                ticket, ignore_queue_limit=ignore_queue_limit, check_capacity=entry.job is not None
            )
            self._launch(decision.started)
            if isinstance(decision, Reject):
                wait_s = decision.estimated_wait_s + self.prefill_wait_s()  # its class's
                raise rejection(replace(decision, estimated_wait_s=wait_s))
            if entry.done.done():
                entry.done.result()  # raises what ended it
                return
            if isinstance(decision, Wait) and self.gate.batch_wait_s > 0:
                # gathering for a batch, or queued: look again when its wait is up
                wait_s = self.gate.batch_wait_s + 0.002  # timers may fire a little early
                asyncio.get_running_loop().call_later(wait_s, self.pump)
            await self._wait(entry, watch)
        finally:
            if entry.run is None:  # never started (a load's entry ends when admitted)
                self._forget(entry)

    async def _wait(self, entry: Entry, watch: ClientWatch | None) -> None:
        """Returns once `entry.done` is; raises what ended the wait (deadline, shutdown, a
        failed run, or the client going away). The watch starts only once the wait has
        lasted WATCH_AFTER_S: most waits are shorter than one forward, and a task per
        waiting request cost a twentieth of the event loop's time at full load."""
        if watch is not None:
            watch.on_leave(functools.partial(self._client_left, entry), WATCH_AFTER_S)
        try:
            await entry.done
        finally:
            if watch is not None:
                watch.clear()

    def _client_left(self, entry: Entry) -> None:
        """A running job is told to stop where its model can (`ModelHandler.stop`; its
        result is dropped either way); a waiting one leaves the queue."""
        if entry.done.done():
            return
        where = "before its result was ready"
        if entry.run is None:
            where = "while queued"
            self._forget(entry)
        elif entry.job is not None:
            entry.job.handler.stop(entry.job.prepared)
        entry.done.set_exception(ClientGone(f"the client disconnected {where}"))

    def _forget(self, entry: Entry) -> None:
        """A ticket that will never run: out of the queue (admitting what that lets in)."""
        if self._entries.pop(entry.ticket.id, None) is not None:
            self._launch(self.gate.cancel(entry.ticket))

    # -- events: admission and completion ---------------------------------------------
    def _launch(self, permits: Sequence[Permit]) -> None:
        """Start the work of permits the gate just granted. A permit whose members all
        left meanwhile goes straight back, and what that admits starts too. The prefix
        cache is first fitted to what the permits leave, before any of their work runs."""
        self.fit_store()
        pending = list(permits)
        while pending:
            permit = pending.pop(0)
            members = [e for tid in permit.ticket_ids if (e := self._entries.get(tid)) is not None]
            if members and members[0].job is None:  # a model load: its caller runs it
                load = self._entries.pop(permit.ticket_id)
                if not load.done.done():
                    load.done.set_result(permit)
                    continue
                members = []  # given up on meanwhile
            if not members:  # everyone left before the group started
                pending += self.gate.release(permit)
                continue
            self._start_run(permit, members)

    def fit_store(self) -> None:
        """The prefix cache may hold what the pool has beyond the permits' bytes: cached
        prefixes never make a request wait, and as the pool follows the device, they go
        first when other programs take memory (the device keeps the reserve free)."""
        if self._store is not None:
            self._store.set_limit(self.gate.pool_bytes() - self.gate.held_bytes)

    def _start_run(self, permit: Permit, members: list[Entry]) -> None:
        jobs = [entry.job for entry in members if entry.job is not None]
        for job, entry in zip(jobs, members, strict=True):
            job.waited_s += permit.admitted_at - entry.ticket.enqueued_at  # after any before
        run = self._runner.launch(permit, jobs)
        for entry in members:
            entry.run = run
            stream = entry.job is not None and entry.job.stream is not None
            if stream and not entry.done.done():
                entry.done.set_result(permit)  # a stream's caller goes on once it runs
        run.work.add_done_callback(functools.partial(self._device_done, run))
        task = asyncio.get_running_loop().create_task(self._runner.settle(run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _device_done(self, run: Running, _: asyncio.Future[Any]) -> None:
        """The device is done with a run: its permit comes back (unless the watchdog gave
        it back already) and its entries end."""
        for ticket_id in run.permit.ticket_ids:
            self._entries.pop(ticket_id, None)
        if run.overdue and not run.ended:
            self.wedged -= 1
            log.warning("an overdue job came back after %.1fs", self._clock() - run.started_at)
        if isinstance(self._runner.device_failed(run), OutOfMemory):
            self._requote(run.key)  # before its permit lets the next one in
        self._release_run(run)

    def _requote(self, key: PriceKey) -> None:
        """The waiting jobs priced under `key` take its price as it is now: an
        out-of-memory raised it, and a ticket quoted before would be let into the room
        that just proved too small, one after another."""
        for ticket in self.gate.waiting:
            job = ticket.payload
            if isinstance(job, Job) and job.key == key:
                job.quote = self._pricer.quote(job.handler, job.key, job.prepared)
                ticket.nbytes, ticket.exclusive = self._pricer.admission(job.quote)

    def _release_run(self, run: Running) -> None:
        if not run.released:
            run.released = True
            self._launch(self.gate.release(run.permit))

    def release(self, permit: Permit) -> None:
        """Give back a load's permit."""
        self._launch(self.gate.release(permit))

    def pump(self) -> None:
        """Re-plan: the pool may have grown, or a batch's gathering time is up."""
        self._launch(self.gate.pump())

    # -- time: deadlines and the watchdog ----------------------------------------------
    def expire(self) -> None:
        """Fail the waiting tickets whose deadline has passed (503 queue_timeout)."""
        expired, started = self.gate.expire()
        self._launch(started)
        for ticket in expired:
            entry = self._entries.pop(ticket.id, None)
            if entry is not None and not entry.done.done():
                wait = self.estimated_wait_s()
                timeout = self._limits.queue_timeout
                entry.done.set_exception(queue_timeout(timeout, wait, self.gate.depth))

    def watch(self, now: float, limit_s: float) -> int:
        """Fail the runs that showed no life for `limit_s` (504) and give their permits
        back: the device memory they may still hold stays out of the pool, which follows
        the device live. Their threads count as wedged until they return."""
        overdue = 0
        for run in list(self.runs()):
            if run.overdue or now - run.progress_at() <= limit_s:
                continue
            if run.jobs[0].handler.stalled():  # its engine ended the silent process:
                run.overdue, run.ended = True, True  # nothing of ours is wedged
                run.ended_error = RunnerStopped(
                    f"model {run.jobs[0].model!r}'s runner's work did not move for {limit_s:g}s "
                    "(run_timeout) and was ended; it is reloaded on the next request",
                    retry_after=1,
                )
                run.work.cancel()  # awaited on the loop: its permit and cells come back now
                log.error("job %s: its runner was silent for %.1fs", run.key.bucket, limit_s)
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
            self._release_run(run)
            log.error("job %s overdue after %.1fs", run.key.bucket, limit_s)
        return overdue

    def estimated_wait_s(self) -> float:
        """How long a request sent now may wait before its work starts: the queue's and
        the runs' learned times (the gate's estimate), and the prefills running now,
        which share the device with it (app.core.prefill)."""
        return self.gate.estimated_wait_s() + self.prefill_wait_s()

    def prefill_wait_s(self) -> float:
        """What the prefills running now still take."""
        now = time.monotonic()  # the streams' clock
        prefilling = [
            Prefilling(run.jobs[0].model, run.merged.tokens, now - run.began)
            for run in self.runs()
            if run.jobs[0].stream is not None and not run.jobs[0].stream.first_step_at
        ]
        return self.prefills.remaining_s(prefilling)

    # -- ending work -------------------------------------------------------------------
    def runs(self) -> Iterator[Running]:
        """The runs whose device work is not done yet, each once (by its leader)."""
        for ticket_id, entry in self._entries.items():
            if entry.run is not None and entry.run.permit.ticket_id == ticket_id:
                yield entry.run

    def running_models(self) -> set[str]:
        """Models with work on the device."""
        return {run.jobs[0].model for run in self.runs()}

    def running_for(self, model: str) -> int:
        """Runs of `model` still on the device (their threads not yet back)."""
        return sum(1 for run in self.runs() if run.jobs[0].model == model)

    def cancel_streams(self, model: str | None = None, reason: Exception | None = None) -> None:
        """Stop running generations (of `model`, or all) before their next step, and
        running one-shot jobs where their model can stop them (`ModelHandler.stop`: a
        transcription's windows still to run)."""
        for run in list(self.runs()):
            for job in run.jobs:
                if model not in (None, job.model):
                    continue
                if job.stream is not None:
                    job.stream.cancel(reason)
                else:
                    job.handler.stop(job.prepared)

    def end_model_work(self, model: str, error: VramgateError) -> None:
        """An unload past its wait: the model's waiting requests fail with `error` and its
        running streams stop before their next step, telling the caller why."""
        self.fail_waiting(model, error)
        self.cancel_streams(model, error)

    def fail_waiting(self, model: str, error: VramgateError) -> int:
        """The model's waiting requests (not its loads) leave the queue with `error`."""
        failed = 0
        for ticket in self.gate.waiting:
            entry = self._entries.get(ticket.id)
            if entry is not None and entry.job is not None and entry.job.model == model:
                self._fail(entry, error)
                failed += 1
        return failed

    def drop_waiting(self, error: VramgateError) -> None:
        """Fail every waiting ticket with `error` (a shutdown, a fatal device error)."""
        for ticket in self.gate.drain_queue():
            entry = self._entries.pop(ticket.id, None)
            if entry is not None and not entry.done.done():
                entry.done.set_exception(error)

    def _fail(self, entry: Entry, error: VramgateError) -> None:
        self._forget(entry)
        if not entry.done.done():
            entry.done.set_exception(error)

    async def stop(self, timeout_s: float) -> None:
        """Let running groups hand out their results, for at most `timeout_s`."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout_s)

    @property
    def entries(self) -> int:
        """Tickets between submission and the end of their device work."""
        return len(self._entries)


def batch_key(job: Job) -> str | None:
    """Which waiting jobs may share its forward: one-shot jobs of its model, of the same
    group where the model has groups (an image generator's size and steps); None: it
    runs on its own (a stream, or a model that takes one request at a time)."""
    handler = job.handler
    if job.stream is not None or handler.spec.max_batch <= 1:
        return None
    group = handler.batch_group(job.prepared)
    return f"{job.model}/{group}" if group else job.model
