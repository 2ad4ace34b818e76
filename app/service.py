"""InferenceService: the life of a request, from price to permit to measured peak.

preprocess (CPU pool) → bucket → price (BudgetBook) → MemoryGate (admit / wait /
reject) → forward (inference pool, peak measured) → record → postprocess (CPU pool).

Every method runs on the event loop thread, which is the single owner of the gate and
the book; only `forward` and pre/postprocessing run on other threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from app.engine.device import Device, MemorySnapshot
from app.engine.executor import Executor, Measurement, drop_references
from app.engine.registry import ModelRegistry
from app.errors import (
    EXIT_FATAL_DEVICE,
    EXIT_WEDGED,
    ClientGone,
    DeviceFailed,
    ExceedsDevice,
    InternalError,
    OutOfMemory,
    Paused,
    QueueFull,
    QueueTimeout,
    ShuttingDown,
    VramgateError,
    WrongModelKind,
)
from app.history import History, Sample
from app.jobs import Job, JobResult, JobRunner
from app.lifecycle import ModelLifecycle
from app.metrics import Metrics
from app.models.base import ModelHandler, Prepared, Prompt
from app.models.textgen import GenerationOutcome, SamplingParams, TokenStream
from app.outcomes import Cost, Generation, InferenceResult
from app.sched.budget import BudgetBook, GenerationSample, PriceKey, Quote
from app.sched.gate import Admit, MemoryGate, Permit, Reject, Ticket, Wait
from app.settings import Settings

log = logging.getLogger("vramgate.service")

HOUSEKEEPING_S = 0.05  # deadlines and the live pool are checked this often
SNAPSHOT_TTL_S = 0.05
SAVE_EVERY_S = 5.0
INLINE_PREPROCESS_CHARS = 4096
WATCH_AFTER_S = 0.25  # a waiting request's disconnect watcher starts after this long
PROBE_TOKENS = 8  # a warm-up or probe generation's length
TASK_WORDS = {
    "embeds": "it has no embeddings",
    "sees": "it does not take images",
    "generates": "it does not generate text",
}
DRAIN_S = 10.0  # running jobs' time to finish after a stop was asked for


def price_size(prepared: Prepared) -> int:
    """The numeric size of the bucket a price is kept under (see `price_key`)."""
    return prepared.kv_bound[0] if prepared.kv_bound else prepared.bucket.size


class InferenceService:
    def __init__(
        self,
        settings: Settings,
        device: Device,
        registry: ModelRegistry,
        book: BudgetBook,
        executor: Executor,
        metrics: Metrics,
        *,
        on_fatal: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.device = device
        self._device_key = device.key  # in every price key: read once
        self.registry = registry
        self.book = book
        self.executor = executor
        self.metrics = metrics
        self._on_fatal = on_fatal
        self.clock = clock
        self.reserve = (
            int(settings.reserve) if settings.reserve is not None else device.default_reserve
        )
        self.baseline = 0  # our memory after the weights loaded; jobs are priced above it
        self.state = "starting"  # starting | loading | warming | ready | stopping | failed
        self.last_alive = clock()  # when a job last completed: a wedged device stops this
        self.paused = False  # the tray's "Pause new requests": new work gets 503
        self.exit_code = 0  # what the process should exit with after a fatal error
        self.stop_deadline: float | None = None  # set once a stop was asked for
        self.wedged_since: float | None = None
        self.in_flight: Counter[str] = Counter()  # requests per model between admit and reply
        self.history = History()
        self._snap: tuple[float, MemorySnapshot] | None = None
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.gate = MemoryGate(
            pool=self.pool_bytes,
            capacity=self.capacity_bytes,
            slots=executor.slots,
            stream_slots=executor.stream_slots,
            max_queue=settings.max_queue,
            clock=clock,
            max_head_bypass=settings.max_head_bypass,
            price_group=lambda tickets: self.runner.price_group(tickets),
            batch_wait_s=settings.max_batch_wait_ms / 1000,
        )
        self.runner = JobRunner(self, self._job_failed)
        self.lifecycle = ModelLifecycle(self)

    # -- memory ------------------------------------------------------------------------
    def snapshot(self, fresh: bool = False) -> MemorySnapshot:
        now = self.clock()
        if fresh or self._snap is None or now - self._snap[0] > SNAPSHOT_TTL_S:
            self._snap = (now, self.device.snapshot())
        return self._snap[1]

    def pool_bytes(self) -> int:
        """What jobs may hold in total now: follows memory other programs take or free."""
        snap = self.snapshot()
        return max(0, snap.free_for_us + snap.ours_allocated - self.baseline - self.reserve)

    def capacity_bytes(self) -> int:
        """The most the pool could be, if every other program let go. A device's total
        never changes: any reading serves (this is asked at every admission)."""
        snap = self._snap[1] if self._snap is not None else self.snapshot()
        return max(0, snap.total - self.baseline - self.reserve)

    def memory_line(self) -> str:
        """A compact device snapshot for log lines."""
        snap = self.snapshot(fresh=True)
        mib = 2**20
        return (
            f"total={snap.total // mib}MiB free={snap.free // mib}MiB ours={snap.ours // mib}MiB "
            f"others={snap.used_by_others // mib}MiB pool={self.pool_bytes() // mib}MiB "
            f"admitted={self.gate.held_bytes // mib}MiB running={self.gate.running} "
            f"queued={self.gate.depth}"
        )

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._housekeeping(), name="housekeeping"))
        self._tasks.append(asyncio.create_task(self._start_models(), name="models"))

    async def _start_models(self) -> None:
        await self.lifecycle.start()
        if self.state in ("ready", "degraded"):
            self._tasks.append(asyncio.create_task(self._probe_loop(), name="probe"))

    def begin_stop(self, drain_s: float = DRAIN_S) -> None:
        """The moment a stop is asked for: refuse new work, fail the waiting (503), and
        give running jobs `drain_s`; streams still running then are stopped."""
        if self.stop_deadline is not None:
            return
        if self.state != "failed":
            self.state = "stopping"
        self.stop_deadline = self.clock() + drain_s
        self._drop_waiting(ShuttingDown("the server is shutting down", retry_after=5))
        asyncio.get_running_loop().call_later(drain_s, self.runner.cancel_streams)

    async def stop(self, drain_s: float = DRAIN_S) -> None:
        """Stop accepting, fail the waiting, let running jobs finish within `drain_s`."""
        self.begin_stop(drain_s)
        assert self.stop_deadline is not None
        deadline = self.stop_deadline
        while self.gate.running and self.clock() < deadline:
            await asyncio.sleep(0.05)
        self.runner.cancel_streams()
        await self.runner.stop(max(1.0, deadline - self.clock()))
        await self.lifecycle.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.book.save()
        self.executor.shutdown(wait=False)

    async def _housekeeping(self) -> None:
        last_save = last_sample = self.clock()
        while True:
            await asyncio.sleep(HOUSEKEEPING_S)
            if self.clock() - last_sample >= 1.0:
                last_sample = self.clock()
                self._sample()
            self._watchdog()
            expired, _ = self.gate.expire()
            for ticket in expired:
                self._fail_waiter(ticket.id, self._timeout_error())
            self.gate.pump()
            if self.book.dirty and self.clock() - last_save > SAVE_EVERY_S:
                self.book.save()
                last_save = self.clock()

    def _watchdog(self) -> None:
        """Jobs without progress for `run_timeout` get 504 and their permits back; /health
        turns unhealthy at once; if a thread is still not back after another
        `run_timeout`, the process ends (exit 76) so the supervisor starts a fresh one."""
        now, limit = self.clock(), self.settings.run_timeout
        if self.runner.watch(now, limit) and self.wedged_since is None:
            self.wedged_since = now
        if not self.runner.wedged:
            self.wedged_since = None
        elif self.wedged_since is not None and now - self.wedged_since > limit:
            self._fatal(
                RuntimeError(f"an inference thread has not come back for {2 * limit:g}s"),
                EXIT_WEDGED,
            )

    def _sample(self) -> None:
        snap = self.snapshot()
        self.history.add_sample(
            Sample(
                t=time.time(),
                total=snap.total,
                used_by_others=snap.used_by_others,
                used_by_us=snap.ours,
                admitted=self.gate.held_bytes,
                pool=self.pool_bytes(),
                depth=self.gate.depth,
                running=self.gate.running,
            )
        )

    async def _probe_loop(self) -> None:
        """The readiness check's tiny real inference on a loaded model, so a wedged
        worker shows. With every model unloaded (the user's choice) nothing can wedge."""
        while True:
            await asyncio.sleep(self.settings.health_interval)
            loaded = [n for n, e in self.registry.entries.items() if e.state == "ready"]
            if not loaded:
                self.last_alive = self.clock()
                continue
            with contextlib.suppress(VramgateError):
                handler = self.registry.get(loaded[0])
                await self.exercise(loaded[0], handler, handler.probe_input())

    @property
    def ready(self) -> bool:
        stale_after = 3 * self.settings.health_interval + self.settings.queue_timeout
        fresh = self.clock() - self.last_alive < stale_after
        return self.state == "ready" and fresh and not self.runner.wedged

    async def exercise(self, model: str, handler: ModelHandler, inputs: list[str]) -> None:
        """One small real request through the normal path: warm-up, or the probe."""
        if handler.embeds:
            await self.embed(model, inputs, probe=True)
            return
        if handler.sees:
            await self.infer(model, handler.warmup_images(), task="sees", probe=True)
            return
        params = SamplingParams(max_tokens=PROBE_TOKENS, temperature=0.0)
        generation = await self.generate(model, " ".join(inputs), params, probe=True)
        try:
            async for _ in generation.deltas():
                pass
            await generation.outcome()
        finally:
            generation.close()

    # -- the life of a request -----------------------------------------------------------
    def embed(
        self,
        model: str,
        texts: list[str],
        *,
        gone: Callable[[], Awaitable[None]] | None = None,
        probe: bool = False,
    ) -> Awaitable[InferenceResult]:
        return self.infer(model, texts, task="embeds", gone=gone, probe=probe)

    async def infer(
        self,
        model: str,
        inputs: list[Any],
        *,
        task: str,
        gone: Callable[[], Awaitable[None]] | None = None,
        probe: bool = False,
    ) -> InferenceResult:
        """A one-shot request (embeddings, images) for a handler that can do `task`."""
        if self._model_away(model, probe):
            await self.lifecycle.wait_loaded(model, self.clock() + self.settings.queue_timeout)
        handler = self._handler_for(model, task, probe)
        self.in_flight[model] += 1
        try:
            return await self._infer(handler, model, inputs, gone, probe)
        finally:
            self.in_flight[model] -= 1

    async def generate(
        self,
        model: str,
        prompt: Prompt,
        params: SamplingParams,
        *,
        gone: Callable[[], Awaitable[None]] | None = None,
        probe: bool = False,
    ) -> Generation:
        """Price and admit a generation; returns once it holds its permit and runs.
        Refusals (503 + Retry-After, 400) are raised here, before any byte is streamed."""
        if self._model_away(model, probe):
            await self.lifecycle.wait_loaded(model, self.clock() + self.settings.queue_timeout)
        handler = self._handler_for(model, "generates", probe)
        cap = self.settings.default_max_tokens
        prepared = await self.executor.run_cpu(handler.prepare_generation, prompt, params, cap)
        key = self.price_key(model, handler, prepared)
        quote = self.quote(handler, key, prepared)
        loop = asyncio.get_running_loop()
        stream = TokenStream(loop)
        job = Job(model, handler, prepared, key, quote, loop.create_future(), stream=stream)
        started = self.clock()
        self.in_flight[model] += 1
        try:
            await self._admit(job, gone, probe)
            waited = job.waited_s
        except BaseException as exc:
            self.in_flight[model] -= 1
            if isinstance(exc, VramgateError):
                self._refused(model, exc)
                self._log_request(model, prepared.bucket.label, quote, 0.0, None, exc.code)
            raise
        job.result.add_done_callback(lambda f: self._generation_done(job, f, waited, started))
        return Generation(job, stream, waited)

    def _generation_done(
        self, job: Job, done: asyncio.Future[JobResult], waited: float, started: float
    ) -> None:
        self.in_flight[job.model] -= 1
        error = done.exception()
        if isinstance(error, VramgateError):
            self._refused(job.model, error)
            self._log_request(job.model, job.label, job.quote, waited, None, error.code)
            return
        if error is not None:
            return
        result = done.result()
        self.last_alive = self.clock()
        run_s = result.measurement.run_s
        self.metrics.observe_success(job.model, waited, run_s, self.clock() - started)
        self._log_request(job.model, job.label, job.quote, waited, result, "ok")

    def record_generation(
        self,
        key: PriceKey,
        prepared: Prepared,
        outcome: GenerationOutcome,
        measurement: Measurement,
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

    def _model_away(self, model: str, probe: bool) -> bool:
        """Whether a request for `model` must first wait for it: a model being unloaded
        or loaded is waited for (up to `queue_timeout`), and an unloaded one is loaded,
        as a request waits for memory in the queue."""
        entry = self.registry.entries.get(model)
        return entry is not None and entry.state not in ("ready", "warming") and not probe

    def _handler_for(self, model: str, task: str, probe: bool) -> ModelHandler:
        """The handler, if the server takes work now and the model can do `task`
        (`embeds`, `generates`, `sees`); a refusal is counted and raised."""
        try:
            handler = self._admissible(model, probe)
            if not getattr(handler, task):
                raise WrongModelKind(
                    f"model {model!r} is a {handler.kind} model: {TASK_WORDS[task]}",
                    param="model",
                )
        except VramgateError as exc:
            self._refused(model, exc)
            raise
        return handler

    def _admissible(self, model: str, probe: bool) -> ModelHandler:
        """The handler, if the server and the model take work now."""
        if self.state in ("stopping", "failed"):
            raise ShuttingDown("the server is shutting down", retry_after=5)
        if self.paused and not probe:
            raise Paused(
                "the server is paused; new requests are refused until resumed", retry_after=30
            )
        self.lifecycle.ensure_loaded(model)
        return self.registry.get(model)

    def _refused(self, model: str, exc: VramgateError) -> None:
        label = model if model in self.registry.entries else "unknown"  # bounded labels
        self.metrics.observe_failure(label, exc.metric_label)
        self.history.add_rejection(label, exc.code, exc.message)

    async def _infer(
        self,
        handler: ModelHandler,
        model: str,
        inputs: list[Any],
        gone: Callable[[], Awaitable[None]] | None,
        probe: bool,
    ) -> InferenceResult:
        if sum(len(item) for item in inputs) <= INLINE_PREPROCESS_CHARS and all(
            isinstance(item, str) for item in inputs
        ):  # tokenised on the loop: a thread hop costs more than the work
            prepared = handler.preprocess(inputs)
        else:  # large inputs and every image on the CPU pool, so the loop stays responsive
            prepared = await self.executor.run_cpu(handler.preprocess, inputs)
        key = self.price_key(model, handler, prepared)
        quote = self.quote(handler, key, prepared)
        started = self.clock()
        job = Job(model, handler, prepared, key, quote, asyncio.get_running_loop().create_future())
        outcome, result = "error", None
        try:
            await self._admit(job, gone, probe, until_done=True)
            result = job.result.result()
            outcome = "ok"
        except VramgateError as exc:
            outcome = exc.code
            self._refused(model, exc)
            raise
        finally:
            self._log_request(model, key.bucket, quote, job.waited_s, result, outcome)
        waited = job.waited_s
        self.last_alive = self.clock()
        run_s = result.measurement.run_s
        self.metrics.observe_success(model, waited, run_s, self.clock() - started)
        cost = Cost(
            result.bucket,
            result.price_bytes,
            quote.source,
            waited,
            run_s,
            result.measurement.peak_bytes,
            result.batch,
        )
        return InferenceResult(result.output, prepared.tokens, cost)

    def price_key(self, model: str, handler: ModelHandler, prepared: Prepared) -> PriceKey:
        """Where the book keeps the price: the bucket, or a generation's prompt bucket
        (its line's tokens are the request's own), on these weights on this device."""
        bucket = f"p{prepared.kv_bound[0]}" if prepared.kv_bound else prepared.bucket.label
        return PriceKey(model, bucket, self._device_key, handler.dtype, handler.fingerprint)

    def quote(self, handler: ModelHandler, key: PriceKey, prepared: Prepared) -> Quote:
        if prepared.kv_bound is not None:
            prompt, tokens = prepared.kv_bound
            return self.book.quote_generation(key, prompt, tokens, handler.geometry(prompt))
        return self.book.quote(key, prepared.bucket.size, handler.prior_bytes(prepared.bucket))

    def admission(self, quote: Quote) -> tuple[int, bool]:
        """The bytes and exclusivity a quote is admitted with. An exclusive price is a
        guess: it runs alone whatever it says, unless proven too big for the device. A
        price that penalties raised above the device, for a bucket never proven too big
        (its floor fits), also runs alone rather than being refused for good."""
        capacity = self.capacity_bytes()
        if quote.exclusive or (quote.nbytes > capacity >= quote.floor):
            return max(min(quote.nbytes, capacity), quote.floor), True
        return quote.nbytes, False

    def record(self, key: PriceKey, prepared: Prepared, measurement: Measurement) -> None:
        if measurement.alone:
            self.book.record(key, prepared.bucket.size, measurement.peak_bytes, measurement.run_s)
        else:
            self.book.record_run_time(key, prepared.bucket.size, measurement.run_s)

    def release(self, permit: Permit) -> None:
        self.gate.release(permit)

    async def admit_load(self, model: str, nbytes: int) -> Permit:
        """Wait until the gate admits a load of `model` for `nbytes` (its weights): a
        load takes memory like a job, so it waits for room like one. Raises ExceedsDevice
        when it can never fit, QueueTimeout when no room came in time."""
        admitted: asyncio.Future[Permit] = asyncio.get_running_loop().create_future()

        def on_admit(permit: Permit) -> None:
            if not admitted.done():
                admitted.set_result(permit)
            else:  # given up on meanwhile
                self.gate.release(permit)

        ticket = Ticket(
            nbytes=nbytes,
            deadline=self.clock() + self.settings.queue_timeout,
            expected_s=1.0,
            exclusive=False,
            label=f"{model}/load",
            on_admit=on_admit,
        )
        ticket.id = self.gate.next_id()
        decision = self.gate.submit(ticket, ignore_queue_limit=True)
        if isinstance(decision, Reject):
            raise self._rejection(decision)
        self._waiters[ticket.id] = admitted
        try:
            return await admitted
        except asyncio.CancelledError:
            self.gate.cancel(ticket)
            raise
        finally:
            self._waiters.pop(ticket.id, None)

    def end_model_work(self, model: str, error: VramgateError) -> None:
        """An unload past its wait: the model's waiting requests fail with `error` and its
        running streams stop before their next step, telling the caller why."""
        for ticket in self.gate.waiting:
            job = self.runner.jobs.get(ticket.id)
            if job is not None and job.model == model:
                self.gate.cancel(ticket)
                self._fail_waiter(ticket.id, error)
        self.runner.cancel_streams(model, error)

    async def _admit(
        self,
        job: Job,
        gone: Callable[[], Awaitable[None]] | None,
        probe: bool,
        *,
        until_done: bool = False,
    ) -> None:
        """Queue the job and wait until it is admitted (maybe as part of a group), or with
        `until_done` until its result is in too: one wait and one wake-up for a one-shot
        request. The seconds it waited for admission land in `job.waited_s`."""
        done: asyncio.Future[Any] = (
            job.result if until_done else asyncio.get_running_loop().create_future()
        )

        def on_admit(permit: Permit) -> None:
            job.waited_s = permit.admitted_at - ticket.enqueued_at
            if not until_done and not done.done():
                done.set_result(permit)
            if permit.ticket_id == ticket.id:  # the group's leader starts it, once
                self.runner.start(permit)

        handler = job.handler
        nbytes, exclusive = self.admission(job.quote)
        ticket = Ticket(
            nbytes=nbytes,
            deadline=self.clock() + self.settings.queue_timeout,
            expected_s=job.quote.expected_s,
            exclusive=exclusive,
            label=f"{job.model}/{job.label}",
            on_admit=on_admit,
            batch_key=job.model if handler.batchable and job.stream is None else None,
            stream=job.stream is not None,
            batch_limit=handler.spec.max_batch,
        )
        ticket.id = self.gate.next_id()
        self.runner.jobs[ticket.id] = job
        try:
            decision = self.gate.submit(ticket, ignore_queue_limit=probe)
            if isinstance(decision, Reject):
                raise self._rejection(decision)
            if isinstance(decision, Admit) and not until_done:
                return
            if isinstance(decision, Wait) and self.gate.batch_wait_s > 0:
                # gathering for a batch, or queued: look again when its wait is up
                wait_s = self.gate.batch_wait_s + 0.002  # timers may fire a little early
                asyncio.get_running_loop().call_later(wait_s, self.gate.pump)
            self._waiters[ticket.id] = done
            await self._wait(ticket, done, gone)
        finally:
            self._waiters.pop(ticket.id, None)
            self.runner.jobs.pop(ticket.id, None)  # still here only if never admitted

    async def _wait(
        self,
        ticket: Ticket,
        done: asyncio.Future[Any],
        gone: Callable[[], Awaitable[None]] | None,
    ) -> None:
        """Returns once `done` is; raises what ended the wait (deadline, shutdown, a failed
        run, or the client going away, which the watcher turns into ClientGone on it).

        The watcher (a task reading the connection) starts only once the wait has lasted
        WATCH_AFTER_S: most waits are shorter than one forward, and a task per waiting
        request cost a twentieth of the event loop's time at full load."""
        watcher: asyncio.Future[None] | None = None

        def watch() -> None:
            nonlocal watcher
            assert gone is not None
            watcher = asyncio.ensure_future(gone())
            watcher.add_done_callback(lambda w: self._client_left(w, ticket, done))

        timer = None
        if gone is not None and not done.done():
            timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, watch)
        try:
            await done
        except asyncio.CancelledError:
            self.gate.cancel(ticket)  # admitted meanwhile: the runner owns the permit
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if watcher is not None:
                watcher.cancel()

    def _client_left(
        self, watcher: asyncio.Future[None], ticket: Ticket, done: asyncio.Future[Any]
    ) -> None:
        if watcher.cancelled() or done.done():
            return
        queued = ticket in self.gate.waiting
        self.gate.cancel(ticket)
        where = "while queued" if queued else "before its result was ready"
        done.set_exception(ClientGone(f"the client disconnected {where}"))

    def _job_failed(
        self, exc: BaseException, key: PriceKey, prepared: Prepared, permit: Permit
    ) -> VramgateError:
        if self.device.is_oom(exc):
            self.metrics.observe_oom()
            log.warning("out of memory in %s/%s: %s", key.model, key.bucket, exc)
            drop_references(exc)  # the failed run's tensors, before the cache is emptied
            self.device.empty_cache()
            self.snapshot(fresh=True)  # the pool as it is after the cache was emptied
            self.book.penalize(
                key,
                price_size(prepared),
                alone=permit.exclusive,
                pool=self.pool_bytes(),
                generation=prepared.kv_bound is not None,
            )
            return OutOfMemory(
                "the device ran out of memory for this request; its price was raised, "
                "retry after the indicated time",
                retry_after=max(1.0, self.gate.estimated_wait_s()),
            )
        if self.device.is_fatal(exc):
            self._fatal(exc)
            return DeviceFailed("the device failed; the server is restarting", retry_after=10)
        log.error("model %s failed: %s: %s", key.model, type(exc).__name__, exc, exc_info=exc)
        return InternalError("the model failed on this request")

    # -- failures ----------------------------------------------------------------------
    def _rejection(self, decision: Reject) -> VramgateError:
        if decision.reason == "exceeds_device":
            return ExceedsDevice(
                f"this request needs {decision.needed} bytes of device memory; at most "
                f"{decision.available} can ever be available on this device",
                details={"needed_bytes": decision.needed, "available_bytes": decision.available},
            )
        wait = max(1.0, decision.estimated_wait_s)
        return QueueFull(
            f"the queue is full ({decision.queue_depth} waiting); retry in {wait:.0f}s",
            retry_after=wait,
            details={
                "reason": "queue_full",
                "queue_depth": decision.queue_depth,
                "estimated_wait_s": round(decision.estimated_wait_s, 3),
            },
        )

    def _timeout_error(self) -> QueueTimeout:
        wait = max(1.0, self.gate.estimated_wait_s())
        return QueueTimeout(
            f"waited {self.settings.queue_timeout:g}s in the queue without being admitted",
            retry_after=wait,
            details={"queue_depth": self.gate.depth},
        )

    def _fail_waiter(self, ticket_id: int, error: VramgateError) -> None:
        waiter = self._waiters.get(ticket_id)
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def _drop_waiting(self, error: VramgateError) -> None:
        for ticket in self.gate.drain_queue():
            self._fail_waiter(ticket.id, error)

    def _fatal(self, exc: BaseException, code: int = EXIT_FATAL_DEVICE) -> None:
        if self.state == "failed":
            return
        self.state = "failed"
        self.exit_code = code
        what = "fatal device error" if code == EXIT_FATAL_DEVICE else "wedged inference"
        log.critical("%s, the server will exit: %s", what, exc)
        self._drop_waiting(DeviceFailed("the device failed; retry shortly", retry_after=10))
        self._on_fatal()

    def _log_request(
        self,
        model: str,
        bucket: str,
        quote: Quote,
        waited: float,
        result: JobResult | None,
        outcome: str,
    ) -> None:
        """One line per request. A request that ran in a batch shows the batch's bucket,
        price and size; its peak is the batch's, measured when it ran alone."""
        measurement = result.measurement if result else None
        peak = measurement.peak_bytes if measurement and measurement.alone else None
        log.info(
            "request model=%s bucket=%s price=%d%s batch=%d queue_ms=%.1f run_ms=%.1f "
            "peak=%s outcome=%s",
            model,
            result.bucket if result else bucket,
            result.price_bytes if result else quote.nbytes,
            " exclusive" if quote.exclusive else "",
            result.batch if result else 1,
            waited * 1000,
            measurement.run_s * 1000 if measurement else 0.0,
            peak if peak is not None else "-",
            outcome,
        )
