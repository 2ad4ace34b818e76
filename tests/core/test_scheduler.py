"""The scheduler on its own: no HTTP, no live server, on the simulated device.

Real parts throughout (the gate, the pricer and its book, the executor's threads, the
simulated device's byte accounting); the one thing the tests hold is the simulated
model's forward, which waits until the test lets it go, so what runs and what waits at
each moment is the tests' to choose. The scheduler's clock is a fake one the tests move
(deadlines); the executor measures real time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.config.settings import ModelSpec, SimulatedBucket, SimulatedGeneration
from app.core import scheduler as scheduler_module
from app.core.failures import FailureMapper
from app.core.memory import MemoryView
from app.core.pricing import Pricer
from app.core.scheduler import Limits, Scheduler
from app.core.watch import ClientWatch
from app.core.work import Job
from app.devices.executor import Executor
from app.devices.simulated import SimulatedDevice
from app.engines.simulated.model import SimulatedHandler
from app.errors import ClientGone, QueueFull, QueueTimeout, ShuttingDown
from app.models.decoding import SamplingParams, TokenStream
from app.models.prepared import Prepared
from app.observe.metrics import Metrics
from app.sched.budget import BudgetBook

MiB = 2**20
CAPACITY = 1000 * MiB
# words → (bytes, seconds) each bucket is taught before a test
BUCKETS = {4: (100 * MiB, 0.01), 16: (300 * MiB, 0.01), 64: (600 * MiB, 1.0)}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class HeldSimulated(SimulatedHandler):
    """The simulated model (its true bytes held on the simulated device while it runs),
    each forward waiting until the test lets one go."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.entered = threading.Semaphore(0)
        self.go = threading.Semaphore(0)

    def forward(self, prepared: Prepared) -> Any:
        self.entered.release()
        assert self.go.acquire(timeout=30), "the test never let this forward go"
        return super().forward(prepared)


class Rig:
    def __init__(self, tmp_path: Path, *, slots: int, max_queue: int = 8, bypass: int = 2):
        self.clock = FakeClock()
        self.device = SimulatedDevice(CAPACITY)
        buckets = tuple(
            SimulatedBucket(size=size, bytes=nbytes, run_ms=0)
            for size, (nbytes, _) in BUCKETS.items()
        )
        generation = SimulatedGeneration(  # a stream of 60 tokens lasts 1.2 s
            kv_bytes_per_token=MiB, true_kv_bytes_per_token=MiB, step_ms=20
        )
        spec = ModelSpec(
            name="sim", kind="simulated", buckets=buckets, max_batch=4, generation=generation
        )
        self.handler = HeldSimulated(spec)
        self.handler.load(self.device)
        self.memory = MemoryView(self.device, 0, self.clock)
        self.book = BudgetBook(tmp_path / "prices.json")
        self.pricer = Pricer(self.book, self.device.key, self.memory.capacity_bytes)
        self.executor = Executor(self.device, slots=slots, stream_slots=1)
        self.fatal: list[BaseException] = []
        failures = FailureMapper(
            self.device, Metrics(), self.pricer, self.memory, self.fatal.append
        )
        self.limits = Limits(queue_timeout=30, max_queue=max_queue, max_head_bypass=bypass)
        self.scheduler = Scheduler(
            pool=self.memory.pool_bytes,
            capacity=self.memory.capacity_bytes,
            pricer=self.pricer,
            executor=self.executor,
            failures=failures,
            limits=self.limits,
            clock=self.clock,
        )
        for size, (nbytes, run_s) in BUCKETS.items():  # learned prices: exact and shared
            prepared = self.handler.preprocess([words(size)])
            key = self.pricer.key("sim", self.handler, prepared)
            for _ in range(2):  # two equal samples: no spread to allow for, the price exact
                self.book.record(key, size, nbytes, run_s)

    def job(self, text: str) -> Job:
        prepared = self.handler.preprocess([text])
        return self._job(prepared, None)

    def stream_job(self, prompt: str, max_tokens: int) -> Job:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        prepared = self.handler.prepare_generation(prompt, params, 64)
        return self._job(prepared, TokenStream(asyncio.get_running_loop()))

    def _job(self, prepared: Prepared, stream: TokenStream | None) -> Job:
        key = self.pricer.key("sim", self.handler, prepared)
        quote = self.pricer.quote(self.handler, key, prepared)
        future = asyncio.get_running_loop().create_future()
        return Job("sim", self.handler, prepared, key, quote, future, stream=stream)

    async def entered(self, count: int = 1) -> None:
        """Wait until `count` more forwards have started on the device."""
        for _ in range(count):
            assert await asyncio.to_thread(self.handler.entered.acquire, timeout=10)

    def let_go(self, count: int = 1) -> None:
        self.handler.go.release(count)

    def close(self) -> None:
        self.handler.go.release(100)
        self.executor.shutdown(wait=True)


def words(count: int) -> str:
    return " ".join(["w"] * count)


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


def run(tmp_path: Path, body: Callable[[Rig], Any], **rig: Any) -> None:
    async def main() -> None:
        r = Rig(tmp_path, **rig)
        try:
            await body(r)
        finally:
            r.close()

    asyncio.run(main())


def test_jobs_start_in_order_and_a_completion_admits_the_next_simulated(tmp_path):
    async def body(r: Rig) -> None:
        a, b, c = (r.job(words(16)) for _ in range(3))  # 300 MiB each, in 1000
        runs = [asyncio.create_task(r.scheduler.run(j, None)) for j in (a, b, c)]
        await r.entered(2)
        gate = r.scheduler.gate
        assert (gate.running, gate.depth, gate.held_bytes) == (2, 1, 600 * MiB)
        assert [t.payload for t in gate.waiting] == [c]  # the third waits: no slot
        r.let_go()  # one of the first two finishes; its release admits the third
        await r.entered()
        assert (gate.running, gate.depth) == (2, 0)
        r.let_go(2)
        await asyncio.gather(*runs)
        assert all(j.result.result().price_bytes == 300 * MiB for j in (a, b, c))
        assert c.waited_s >= 0 and r.scheduler.entries == 0 and gate.held_bytes == 0

    run(tmp_path, body, slots=2)


def test_small_jobs_pass_a_blocked_head_at_most_max_head_bypass_times_simulated(tmp_path):
    async def body(r: Rig) -> None:
        holder = r.job(words(64))  # 600 MiB, expected to run 1 s
        tasks = [asyncio.create_task(r.scheduler.run(holder, None))]
        await r.entered()
        head = r.job(words(64))  # another 600 MiB: cannot fit beside the first
        smalls = [r.job(words(4)) for _ in range(3)]  # 100 MiB each, 10 ms
        tasks.append(asyncio.create_task(r.scheduler.run(head, None)))
        await until(lambda: r.scheduler.gate.depth == 1, "the head waits")
        tasks += [asyncio.create_task(r.scheduler.run(j, None)) for j in smalls]
        await r.entered(2)  # two small jobs overtake the head...
        gate = r.scheduler.gate
        await until(lambda: gate.depth == 2, "the third small job waits")
        assert [t.payload for t in gate.waiting] == [head, smalls[2]]  # ...the third may not
        assert gate.waiting[0].bypassed == 2
        r.let_go(3)  # the holder and the two small ones end: the head runs, then the last
        await r.entered(2)
        r.let_go(2)
        await asyncio.gather(*tasks)
        assert r.scheduler.entries == 0 and gate.held_bytes == 0

    run(tmp_path, body, slots=4, bypass=2)


def test_waiting_jobs_of_a_model_run_as_one_group_at_the_group_price_simulated(tmp_path):
    async def body(r: Rig) -> None:
        first = r.job(words(4))
        tasks = [asyncio.create_task(r.scheduler.run(first, None))]
        await r.entered()  # the only slot is taken: the next three gather in the queue
        riders = [r.job(words(3)) for _ in range(3)]
        tasks += [asyncio.create_task(r.scheduler.run(j, None)) for j in riders]
        await until(lambda: r.scheduler.gate.depth == 3, "three waiting")
        priced = r.pricer.group_admission(riders)  # 9 words: the 16-word bucket's price
        assert priced == (300 * MiB, False)
        calls = r.handler.forward_calls
        r.let_go()
        await r.entered()  # one forward for the three
        assert r.scheduler.gate.depth == 0 and r.scheduler.gate.running == 1
        r.let_go()
        await asyncio.gather(*tasks)
        results = [j.result.result() for j in riders]
        assert {(x.batch, x.bucket, x.price_bytes) for x in results} == {(3, "w16", 300 * MiB)}
        assert r.handler.forward_calls == calls + 2  # the first's forward and the group's
        rows = [x.output for x in results]
        assert all(len(row) == 1 for row in rows)  # each its own row back

    run(tmp_path, body, slots=1)


def test_cancelled_while_waiting_leaves_the_queue_and_while_running_keeps_its_bytes_simulated(
    tmp_path,
):
    async def body(r: Rig) -> None:
        running, waiting = r.job(words(64)), r.job(words(64))
        first = asyncio.create_task(r.scheduler.run(running, None))
        await r.entered()
        second = asyncio.create_task(r.scheduler.run(waiting, None))
        gate = r.scheduler.gate
        await until(lambda: gate.depth == 1, "the second waits")
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        assert gate.depth == 0 and r.scheduler.entries == 1
        first.cancel()  # its caller is gone, but the device is still busy with it
        with pytest.raises(asyncio.CancelledError):
            await first
        assert gate.held_bytes == 600 * MiB and r.scheduler.running_for("sim") == 1
        r.let_go()
        await until(lambda: r.scheduler.entries == 0, "the run ends")
        assert gate.held_bytes == 0 and gate.running == 0

    run(tmp_path, body, slots=2)


def test_a_client_that_leaves_while_queued_gets_client_gone_simulated(tmp_path, monkeypatch):
    monkeypatch.setattr(scheduler_module, "WATCH_AFTER_S", 0.0)

    async def body(r: Rig) -> None:
        left = asyncio.Event()
        first = asyncio.create_task(r.scheduler.run(r.job(words(64)), None))
        await r.entered()
        watch = ClientWatch(left.wait)
        second = asyncio.create_task(r.scheduler.run(r.job(words(64)), watch))
        await until(lambda: r.scheduler.gate.depth == 1, "queued")
        left.set()
        with pytest.raises(ClientGone, match="while queued"):
            await second
        assert r.scheduler.gate.depth == 0
        watch.close()
        r.let_go()
        await first

    run(tmp_path, body, slots=2)


def test_a_ticket_past_its_deadline_gets_queue_timeout_and_the_queue_bound_holds_simulated(
    tmp_path,
):
    async def body(r: Rig) -> None:
        first = asyncio.create_task(r.scheduler.run(r.job(words(64)), None))
        await r.entered()
        late = asyncio.create_task(r.scheduler.run(r.job(words(64)), None))
        await until(lambda: r.scheduler.gate.depth == 1, "queued")
        with pytest.raises(QueueFull):  # max_queue 1: the next is refused at once
            await r.scheduler.run(r.job(words(64)), None)
        r.clock.now += r.limits.queue_timeout - 1
        r.scheduler.expire()
        assert not late.done()
        r.clock.now += 2
        r.scheduler.expire()
        with pytest.raises(QueueTimeout) as caught:
            await late
        assert caught.value.code == "queue_timeout" and r.scheduler.gate.depth == 0
        r.let_go()
        await first
        assert r.scheduler.entries == 0

    run(tmp_path, body, slots=2, max_queue=1)


def test_shutdown_fails_the_waiting_stops_streams_and_lets_running_jobs_finish_simulated(
    tmp_path,
):
    async def body(r: Rig) -> None:
        stream = r.stream_job(words(8), max_tokens=50)  # the simulated model generates
        await r.scheduler.start(stream, None)  # returns once it runs
        assert r.scheduler.gate.running_streams == 1
        one_shot = r.job(words(64))
        running = asyncio.create_task(r.scheduler.run(one_shot, None))
        await r.entered()
        waiting = asyncio.create_task(r.scheduler.run(r.job(words(64)), None))
        await until(lambda: r.scheduler.gate.depth == 1, "queued")
        r.scheduler.drop_waiting(ShuttingDown("the server is shutting down", retry_after=5))
        with pytest.raises(ShuttingDown):
            await waiting
        r.scheduler.cancel_streams()
        outcome = (await stream.result).output
        assert outcome.finish_reason == "cancelled"
        assert not running.done()  # the running job is not cut short
        r.let_go()
        await r.scheduler.stop(timeout_s=10)
        await running
        assert one_shot.result.result().batch == 1
        await until(lambda: r.scheduler.entries == 0, "every run ended")
        assert r.scheduler.gate.held_bytes == 0

    run(tmp_path, body, slots=2)


def test_a_load_waits_for_room_and_is_admitted_when_a_job_ends_simulated(tmp_path):
    async def body(r: Rig) -> None:
        job = r.job(words(64))  # 600 MiB
        running = asyncio.create_task(r.scheduler.run(job, None))
        await r.entered()
        load = asyncio.create_task(r.scheduler.admit_load("other", 700 * MiB))
        await until(lambda: r.scheduler.gate.depth == 1, "the load waits for room")
        r.let_go()
        permit = await load
        assert permit.nbytes == 700 * MiB and r.scheduler.gate.held_bytes == 700 * MiB
        await running
        r.scheduler.release(permit)
        assert r.scheduler.gate.held_bytes == 0 and r.scheduler.entries == 0

    run(tmp_path, body, slots=2)


def test_a_model_that_runs_one_request_at_a_time_gets_one_at_a_time_simulated(
    tmp_path, monkeypatch
):
    """A model whose own limit is one request at once (`cell_capacity` 1: a sliding-
    window LM, whose rows cannot join a running batch): the second waits in the queue
    though bytes and slots are free, and runs once the first ends."""
    monkeypatch.setattr(HeldSimulated, "cell_capacity", 1)

    async def body(r: Rig) -> None:
        first, second = r.job(words(4)), r.job(words(4))  # 100 MiB each, 2 slots
        tasks = [asyncio.create_task(r.scheduler.run(j, None)) for j in (first, second)]
        await r.entered()
        gate = r.scheduler.gate
        await until(lambda: gate.depth == 1, "the second waits")
        assert (gate.running, [t.payload for t in gate.waiting]) == (1, [second])
        r.let_go()
        await r.entered()
        r.let_go()
        await asyncio.gather(*tasks)

    run(tmp_path, body, slots=2)


def test_a_silent_runners_run_ends_its_requests_and_frees_its_permit_simulated(
    tmp_path, monkeypatch
):
    """Work awaited from a runner that falls silent, whose engine ends it (`stalled`),
    even when the work never comes back (a process stuck in its driver keeps its sockets
    open past SIGKILL): its requests get model_runner_stopped, its permit comes back,
    and nothing counts as a wedged thread of ours."""
    from app.errors import RunnerStopped

    monkeypatch.setattr(HeldSimulated, "stalled", lambda self: True)

    async def body(r: Rig) -> None:
        never = asyncio.get_running_loop().create_future()  # the work, never done
        monkeypatch.setattr(HeldSimulated, "start", lambda self, prepared, stream, pools: never)
        job = r.job(words(4))
        task = asyncio.create_task(r.scheduler.run(job, None))
        gate = r.scheduler.gate
        await until(lambda: gate.running == 1, "it runs")
        r.clock.now += 120  # silent past run_timeout
        assert r.scheduler.watch(r.clock.now, 60) == 0 and r.scheduler.wedged == 0
        with pytest.raises(RunnerStopped):
            await task
        await until(lambda: gate.running == 0, "its permit back")
        assert gate.held_bytes == 0 and r.scheduler.entries == 0

    run(tmp_path, body, slots=2)
