"""Keep-alive: how long an idle model stays loaded. Durations as people write them; then a
whole service in-process (the simulated device and model, as config choices) on a clock
the test moves, so no test sleeps through a keep-alive."""

from __future__ import annotations

import asyncio
import math

import pytest

from app.api.app import build_core
from app.config.durations import parse_keep_alive
from app.config.settings import ModelSpec
from app.core.health.exercise import exercise
from app.core.requests import ValidEmbeddingRequest
from tests.support.live import make_settings


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25), ("10", 10.0),
        (0, 0.0), (2.5, 2.5), ("0", 0.0), (-1, math.inf), ("-1", math.inf), ("-5m", math.inf),
    ],
)  # fmt: skip
def test_durations_are_read_as_ollama_writes_them(text, seconds):
    assert parse_keep_alive(text) == seconds


@pytest.mark.parametrize("bad", ["five minutes", "5 m", "m", "", "1d", True, "nan"])
def test_what_is_not_a_duration_is_refused(bad):
    with pytest.raises(ValueError):
        parse_keep_alive(bad)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run(tmp_path, scenario, *, keep_alive: float = 60, model_keep_alive: float | None = None):
    """`scenario(service, clock)` against a started service serving one simulated model."""
    clock = Clock()
    spec = ModelSpec(name="sim", kind="simulated", keep_alive=model_keep_alive)
    settings = make_settings(
        tmp_path, device="simulated:4GiB", models=(spec,), keep_alive=keep_alive
    )

    async def main() -> None:
        service = build_core(settings, clock=clock).lanes[0]
        await service.start()
        try:
            await until(lambda: service.registry.entries["sim"].state == "ready")
            await scenario(service, clock)
        finally:
            await service.stop(drain_s=1)

    asyncio.run(main())


async def until(condition, what: str = "") -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


async def ask(service, keep_alive: float | None = None) -> None:
    request = ValidEmbeddingRequest("sim", ["one two three"], keep_alive=keep_alive)
    await service.run(request)


async def unloads_now(service) -> bool:
    """Whether the keep-alive check unloads the model at this clock reading."""
    if not service.lifecycle.unload_idle():
        return False
    await until(lambda: service.registry.entries["sim"].state == "unloaded", "unloaded")
    return True


def evictions(service) -> float:
    return service.metrics.evictions.labels("keep_alive", service.device.id)._value.get()


def test_an_idle_model_goes_after_its_keep_alive_and_comes_back_on_demand(tmp_path):
    async def scenario(service, clock):
        await ask(service)
        clock.now += 59
        assert not await unloads_now(service)  # 59 s idle of 60
        clock.now += 2
        assert await unloads_now(service)
        await until(lambda: evictions(service) == 1, "the eviction counted")
        await ask(service)  # loaded again for the next request, and answered
        await until(lambda: service.registry.entries["sim"].state == "ready", "ready again")

    run(tmp_path, scenario, keep_alive=60)


def test_keep_alive_0_unloads_once_the_request_is_answered(tmp_path):
    async def scenario(service, clock):
        await ask(service, keep_alive=0.0)
        assert await unloads_now(service)  # no time passed

    run(tmp_path, scenario)


def test_keep_alive_minus_1_keeps_the_model_for_good(tmp_path):
    async def scenario(service, clock):
        await ask(service, keep_alive=parse_keep_alive(-1))
        clock.now += 10**7
        assert not await unloads_now(service)
        await ask(service, keep_alive=5.0)  # a later request sets it anew
        clock.now += 6
        assert await unloads_now(service)

    run(tmp_path, scenario)


def test_a_models_own_keep_alive_wins_over_the_setting(tmp_path):
    async def scenario(service, clock):
        await ask(service)
        clock.now += 11
        assert await unloads_now(service)

    run(tmp_path, scenario, keep_alive=600, model_keep_alive=10)


def test_the_readiness_probe_does_not_keep_a_model_alive(tmp_path):
    async def scenario(service, clock):
        await ask(service)
        clock.now += 40
        handler = service.registry.get("sim")
        await exercise(service, "sim", handler, probe_only=True)  # the health probe
        clock.now += 21  # 61 s after the last real request
        assert await unloads_now(service)

    run(tmp_path, scenario, keep_alive=60)


def test_a_model_loaded_at_start_and_never_asked_idles_from_its_load(tmp_path):
    async def scenario(service, clock):
        clock.now += 61
        assert await unloads_now(service)

    run(tmp_path, scenario, keep_alive=60)


def test_a_request_that_comes_while_its_model_is_unloading_waits_for_the_reload(tmp_path):
    """The keep-alive check starts an unload; a request arrives before it is done: the
    request is answered once the model is back (never ended by the unload, never 503)."""

    async def scenario(service, clock):
        await ask(service, keep_alive=0.0)
        assert service.lifecycle.unload_idle() == ["sim"]  # started, not yet done
        assert service.registry.entries["sim"].state == "unloading"
        await ask(service)  # answered, not 503 model_loading
        assert service.registry.entries["sim"].state in ("warming", "ready")
        assert evictions(service) == 1
        await until(lambda: service.registry.entries["sim"].state == "ready", "ready again")
        assert not await unloads_now(service)  # the reload's request asked for no keep_alive
        clock.now += 61
        assert await unloads_now(service)

    run(tmp_path, scenario, keep_alive=60)


def test_a_keep_alive_asked_by_the_request_that_loads_its_model_holds(tmp_path):
    async def scenario(service, clock):
        clock.now += 61
        assert await unloads_now(service)
        await ask(service, keep_alive=0.0)  # waits for the reload, asks to unload after
        await until(lambda: service.registry.entries["sim"].state == "ready", "ready again")
        assert await unloads_now(service)

    run(tmp_path, scenario)
