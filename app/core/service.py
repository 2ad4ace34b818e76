"""InferenceService: the front door, and what the core is built from.

A route hands it a validated request; it checks what needs a model (its state, its
kind, `dimensions`) before anything is queued, prices the work, hands it to the
scheduler, and gives back a typed result with its cost: an `InferenceResult`, or an
`AdmittedGeneration` to stream from. Every refusal is counted and logged here, once.
Every method runs on the event loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from app.config.settings import Settings
from app.core import priority
from app.core.failures import FailureMapper
from app.core.health.exercise import exercise, probe_loop
from app.core.health.readiness import Health
from app.core.health.spill import SPILL_WARNING, SpillWatch
from app.core.lifecycle.keep_alive import InFlight
from app.core.lifecycle.lifecycle import ModelLifecycle
from app.core.lifecycle.registry import ModelRegistry
from app.core.memory import MemoryView
from app.core.overflow import prepare_within
from app.core.pricing import Pricer
from app.core.requests import OneShotRequest, ValidGenerationRequest
from app.core.scheduler import Limits, Scheduler
from app.core.snapshot import CoreSnapshot
from app.core.state import ServerState
from app.core.watch import ClientWatch
from app.core.work import (
    AdmittedGeneration,
    InferenceResult,
    Job,
    JobResult,
    cost_of,
    log_refusal,
    log_request,
)
from app.devices.base import Device
from app.devices.executor import Executor
from app.errors import (
    EXIT_FATAL_DEVICE,
    ClientGone,
    DeviceFailed,
    ModelEvicted,
    ModelLoading,
    Paused,
    ShuttingDown,
    VramgateError,
)
from app.models.base import ModelHandler
from app.models.decoding import TokenStream
from app.models.kinds import Generator, OneShotModel, required
from app.observe.history import History
from app.observe.metrics import Metrics
from app.sched.budget import BudgetBook
from app.sched.priority import Priority

log = logging.getLogger("vramgate.service")

HOUSEKEEPING_S = 0.05  # deadlines and the live pool are checked this often
SAVE_EVERY_S = 5.0
DRAIN_S = 10.0  # running jobs' time to finish after a stop was asked for
H = TypeVar("H", bound=ModelHandler)


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
        history: History | None = None,  # shared by the devices' services (app.core.fleet.fleet)
    ) -> None:
        self.settings = settings
        self.device = device
        self.registry = registry
        self.book = book
        self.executor = executor
        self.metrics = metrics
        self._on_fatal = on_fatal
        self.clock = clock
        reserve = settings.reserve if settings.reserve is not None else device.default_reserve
        self.state = ServerState()
        self.memory = MemoryView(device, int(reserve), clock)
        self.pricer = Pricer(book, device.key, self.memory.capacity_bytes)
        failures = FailureMapper(device, metrics, self.pricer, self.memory, self._fatal)
        self.scheduler = Scheduler(
            pool=self.memory.pool_bytes,
            capacity=self.memory.capacity_bytes,
            pricer=self.pricer,
            executor=executor,
            failures=failures,
            limits=Limits.of(settings, device.kind),
            clock=clock,
            store=registry.store,
        )
        self.health = Health(self.state, self.scheduler, settings, clock, self._fatal)
        self.in_flight = InFlight(clock)  # requests per model, admission to reply
        self.lifecycle = ModelLifecycle(
            registry,
            self.scheduler,
            executor,
            self.memory,
            self.state,
            warm_up=self._warm_up,
            in_flight=self.in_flight,
            run_timeout=settings.run_timeout,
            clock=clock,
            keep_alive_s=settings.keep_alive,
            headroom=int(settings.headroom),
            on_unloaded=lambda _, reason: metrics.evictions.labels(reason, device.id).inc(),
        )
        self.memory.reclaimable = self.lifecycle.reclaimable
        self.history = history if history is not None else History()
        self.spill = SpillWatch()  # a driver spilling into system RAM (app.core.health.spill)
        self._tasks: list[asyncio.Task[None]] = []

    # -- what it looks like ------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.health.ready

    def store_view(self) -> dict[str, Any]:
        """The device's prefix cache: bytes, entries, hits (app.models.prefix_cache)."""
        return self.registry.store.view()

    def view(self) -> CoreSnapshot:
        """One picture of the core now (see app.core.snapshot)."""
        scheduler = self.scheduler
        wait_s = scheduler.estimated_wait_s()
        return CoreSnapshot.of(self.state, self.health.ready, self.memory, scheduler.gate, wait_s)

    def memory_line(self) -> str:
        """A compact device snapshot for log lines."""
        self.memory.snapshot(fresh=True)
        return self.view().line()

    # -- start and stop ----------------------------------------------------------------
    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._housekeeping(), name="housekeeping"))
        self._tasks.append(asyncio.create_task(self._start_models(), name="models"))

    async def _start_models(self) -> None:
        try:
            await self.lifecycle.start()
        except Exception:  # a fault of ours: said, and the models that loaded serve on
            log.exception("starting the models failed; serving what loaded")
            if self.state.phase not in ("stopping", "failed"):
                self.state.phase = "degraded"
        self.health.alive()
        if self.state.serving:
            self._tasks.append(asyncio.create_task(probe_loop(self), name="probe"))

    def begin_stop(self, drain_s: float = DRAIN_S) -> None:
        """The moment a stop is asked for: refuse new work, fail the waiting (503), and
        give running jobs `drain_s`; streams still running then are stopped."""
        if self.state.stop_deadline is not None:
            return
        if self.state.phase != "failed":
            self.state.phase = "stopping"
        self.state.stop_deadline = self.clock() + drain_s
        self.scheduler.drop_waiting(ShuttingDown("the server is shutting down", retry_after=5))
        asyncio.get_running_loop().call_later(drain_s, self.scheduler.cancel_streams)

    async def stop(self, drain_s: float = DRAIN_S) -> None:
        """Stop accepting, fail the waiting, let running jobs finish within `drain_s`."""
        self.begin_stop(drain_s)
        assert self.state.stop_deadline is not None
        deadline = self.state.stop_deadline
        while self.scheduler.gate.running and self.clock() < deadline:
            await asyncio.sleep(0.05)
        self.scheduler.cancel_streams()
        await self.scheduler.stop(max(1.0, deadline - self.clock()))
        await self.lifecycle.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.book.save()
        self.executor.shutdown(wait=False)

    async def _housekeeping(self) -> None:
        last_save = self.clock()
        while True:
            await asyncio.sleep(HOUSEKEEPING_S)
            self.health.watchdog()
            self.scheduler.expire()
            self.scheduler.pump()
            self.lifecycle.unload_idle()
            self.lifecycle.reap()
            self.lifecycle.reclaim()
            self.lifecycle.retire()
            if self.book.dirty and self.clock() - last_save > SAVE_EVERY_S:
                self.book.save()
                last_save = self.clock()

    def _fatal(self, exc: BaseException, code: int = EXIT_FATAL_DEVICE) -> None:
        if self.state.phase == "failed":
            return
        self.state.phase = "failed"
        self.state.exit_code = code
        what = "fatal device error" if code == EXIT_FATAL_DEVICE else "wedged inference"
        log.critical("%s, the server will exit: %s", what, exc)
        error = DeviceFailed("the device failed; retry shortly", retry_after=10)
        self.scheduler.drop_waiting(error)
        self._on_fatal()

    # -- warm-up and the probe: real requests through the normal path -------------------
    async def _warm_up(self, model: str, handler: ModelHandler) -> None:
        await exercise(self, model, handler, probe_only=False)

    # -- the front door ----------------------------------------------------------------
    async def run(
        self, request: OneShotRequest, watch: ClientWatch | None = None
    ) -> InferenceResult:
        """Any one-shot request (app.core.requests): its model, if it can do what the
        request needs and accepts it; then its rows, queued, run and shaped."""
        keep, arrived = request.keep_alive, self.clock()
        handler = await self.serving(
            request.model, request.capability, probe=False, keep_alive=keep
        )
        if (error := request.refusal(handler)) is not None:
            self._refused(request.model, error)
            raise error
        model_wait_s = self.clock() - arrived
        result = await self.one_shot(request.model, handler, request.items(), watch, model_wait_s)
        return request.finish(handler, result)

    async def generate(
        self, request: ValidGenerationRequest, watch: ClientWatch | None, *, probe: bool = False
    ) -> AdmittedGeneration:
        """Price and admit a generation; returns once it holds its permit and runs.
        Refusals (503 + Retry-After, 400) are raised here, before any byte is streamed."""
        model, arrived = request.model, self.clock()
        handler = await self.serving(model, Generator, probe=probe, keep_alive=request.keep_alive)
        model_wait_s = self.clock() - arrived
        self.in_flight[model] += 1  # from here (no await between): no unload takes it away
        try:
            cap, prompt, params = self.settings.default_max_tokens, request.prompt, request.params
            prepared, truncated = await prepare_within(
                handler, prompt, params, cap, self.executor, request.overflow
            )
        except BaseException:
            self.in_flight[model] -= 1
            raise
        stream = TokenStream(asyncio.get_running_loop())
        try:
            job = await self._queued(model, handler, prepared, stream, watch, probe, model_wait_s)
        except BaseException:
            self.in_flight[model] -= 1
            raise
        started = self.clock()
        job.result.add_done_callback(lambda done: self._generation_done(job, done, started, probe))
        return AdmittedGeneration(job, stream, truncated)

    def _generation_done(
        self, job: Job, done: asyncio.Future[JobResult], started: float, probe: bool
    ) -> None:
        self.in_flight[job.model] -= 1
        if done.cancelled():
            return
        error = done.exception()
        if isinstance(error, VramgateError):
            self._refused(job.model, error, job)
            return
        if error is not None:
            return
        result = done.result()
        ended = job.stream.cancel_reason if job.stream is not None else None
        if result.output.finish_reason == "cancelled" and not isinstance(ended, VramgateError):
            # the caller left while it streamed (a Stop button): the caller's, not served
            self.health.alive()
            left = ClientGone("the client disconnected while its answer streamed")
            left.counted = True
            self.metrics.observe_failure(job.model, left.metric_label, self.device.id)
            self.history.add_rejection(job.model, left.code, left.message)  # the dashboard
            log_request(job, result, left.code)
            return
        self._served(job, result, started, probe)

    async def one_shot(
        self,
        model: str,
        handler: OneShotModel[Any],
        inputs: list[Any],
        watch: ClientWatch | None,
        model_wait_s: float = 0.0,
        *,
        probe: bool = False,
    ) -> InferenceResult:
        """`model_wait_s`: its wait for its model to load (part of its queue wait)."""
        self.in_flight[model] += 1
        try:
            return await self._run_one_shot(model, handler, inputs, watch, probe, model_wait_s)
        finally:
            self.in_flight[model] -= 1

    async def _run_one_shot(
        self,
        model: str,
        handler: OneShotModel[Any],
        inputs: list[Any],
        watch: ClientWatch | None,
        probe: bool,
        model_wait_s: float,
    ) -> InferenceResult:
        prepared = await handler.prepare_inputs(inputs, self.executor)
        started = self.clock()
        job = await self._queued(model, handler, prepared, None, watch, probe, model_wait_s)
        result = job.result.result()
        self._served(job, result, started, probe)
        return InferenceResult(result.output, prepared.tokens, cost_of(result, job))

    async def _queued(
        self,
        model: str,
        handler: ModelHandler,
        prepared: Any,
        stream: TokenStream | None,
        watch: ClientWatch | None,
        probe: bool,
        model_wait_s: float,
    ) -> Job:
        """Queue the work and return its job: a stream once it runs, a one-shot job once
        done. A request whose model is unloaded while it waits (to make room for another)
        waits for the reload and queues again, within its queue_timeout. Its queue wait
        counts every wait for its model (`model_wait_s` before this). A refusal is
        counted and logged here."""
        deadline = self.clock() + self.settings.queue_timeout
        model_wait_s -= self.clock()  # plus the time from here to this job's queueing
        job: Job | None = None
        try:
            while True:
                if self.lifecycle.away(model):
                    await self.lifecycle.wait_loaded(model, deadline)
                    if self.registry.get(model) is not handler:  # 503 if it is still away
                        raise ModelLoading(f"model {model!r} was replaced; retry", retry_after=1)
                job = self._job(model, handler, prepared, stream)
                job.waited_s = model_wait_s + self.clock()  # the scheduler adds its own
                try:
                    if stream is None:
                        await self.scheduler.run(job, watch, probe=probe)
                    else:
                        await self.scheduler.start(job, watch, probe=probe)
                    return job
                except ModelEvicted:
                    if self.clock() >= deadline:
                        raise
        except VramgateError as exc:
            self._refused(model, exc, job)
            raise

    def _job(
        self, model: str, handler: ModelHandler, prepared: Any, stream: TokenStream | None
    ) -> Job:
        """The request priced: its own way, or a leaner one where the scheduler prefers
        that (an image that fits now only with its VAE decoded in tiles)."""
        key = self.pricer.key(model, handler, prepared)
        quote = self.pricer.quote(handler, key, prepared)
        done = asyncio.get_running_loop().create_future()
        job = Job(model, handler, prepared, key, quote, done, stream=stream, device=self.device.id)
        inputs = prepared.count if stream is None else 1
        default = Priority[handler.spec.priority.upper()]
        job.priority = priority.settle(default, inputs, self.settings.background_inputs)
        lean = handler.leaner(prepared)
        if lean is not None and stream is None:
            job = self.scheduler.prefer(job, self._job(model, handler, lean, None))
        return job

    async def serving(
        self, model: str, capability: type[H], *, probe: bool, keep_alive: float | None = None
    ) -> H:
        """The handler, if the server takes work now and the model can do what
        `capability` is; a request for a model that is away, or whose changed config
        entry replaces it once what it runs has ended, waits for it (up to
        `queue_timeout`), and sets how long it stays loaded. A refusal is counted."""
        try:
            # a model of another kind is refused before anything loads or waits for it
            required(self.registry.entry(model).handler, capability, model)
            if not probe:
                self.lifecycle.keep_alive.request(model, keep_alive, self.clock())
            lifecycle = self.lifecycle
            if not probe and (lifecycle.away(model) or lifecycle.replacing(model)):
                deadline = self.clock() + self.settings.queue_timeout
                await self.lifecycle.wait_loaded(model, deadline)
            if self.state.ending:
                raise ShuttingDown("the server is shutting down", retry_after=5)
            if self.state.paused and not probe:
                raise Paused(
                    "the server is paused; new requests are refused until resumed",
                    retry_after=30,
                )
            self.lifecycle.ensure_loaded(model)
            return self.registry.serving(model, capability)
        except VramgateError as exc:
            self._refused(model, exc)
            raise

    def _served(self, job: Job, result: JobResult, started: float, probe: bool) -> None:
        """A job done: the device is alive. A caller's is counted as served; a warm-up's
        or probe's only logged."""
        self.health.alive()
        if probe:
            log_request(job, result, "probe")
            return
        waited, run_s = job.waited_s, result.measurement.run_s
        total_s = self.clock() - started
        self.metrics.observe_success(job.model, waited, run_s, total_s, self.device.id)
        log_request(job, result, "ok")
        if self.device.kind in ("cuda", "simulated") and job.stream is None:
            self._watch_spill(run_s, job.quote.expected_s)

    def _watch_spill(self, run_s: float, expected_s: float) -> None:
        """A driver that spills into system RAM is said where the person looks (the
        device's warnings: /status, the tray), and unsaid once runs are fast again."""
        snap, was = self.memory.snapshot(), self.spill.spilling
        if self.spill.observe(run_s, expected_s, snap.free, snap.total) == was:
            return
        self.device.warnings = self.spill.warnings(self.device.warnings)
        if self.spill.spilling:
            log.warning("device %s: %s", self.device.id, SPILL_WARNING)

    def _refused(self, model: str, exc: VramgateError, job: Job | None = None) -> None:
        """Counted (/metrics, /status, the history) and logged, once: `job`'s request line,
        else a line of its own."""
        if exc.counted:
            return
        exc.counted = True
        label = model if model in self.registry.entries else "unknown"  # bounded labels
        self.metrics.observe_failure(label, exc.metric_label, self.device.id)
        self.history.add_rejection(label, exc.code, exc.message)
        if job is not None:
            log_request(job, None, exc.code)
        else:
            log_refusal(exc, f"model={label}")
