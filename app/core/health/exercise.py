"""Warm-up and the readiness probe: real requests through the service's normal path.

A model's warm-up sends a few requests of its common sizes, so that their buckets have
learned prices before the first caller arrives; the probe sends one tiny request, so that
a wedged worker shows. Both pass the gate like any request, but never wait for a paused
server, never count against the queue limit, and never touch a model's keep-alive.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

from app.config.settings import Settings
from app.core.health.readiness import Health
from app.core.lifecycle.registry import ModelRegistry
from app.core.requests import ValidGenerationRequest
from app.core.watch import ClientWatch
from app.core.work import AdmittedGeneration, InferenceResult
from app.errors import ExceedsDevice, OutOfMemory, VramgateError
from app.models.base import ModelHandler
from app.models.decoding import SamplingParams
from app.models.kinds import OneShotModel

PROBE_TOKENS = 8  # a warm-up or probe generation's length


class Door(Protocol):
    """What warm-up and the probe use of the service (app.core.service): its front door
    and what it knows, and nothing that would tie this module back to it."""

    settings: Settings
    registry: ModelRegistry
    health: Health

    async def serving(
        self, model: str, capability: Any, *, probe: bool, keep_alive: float | None = None
    ) -> Any: ...

    async def one_shot(
        self,
        model: str,
        handler: OneShotModel[Any],
        inputs: list[Any],
        watch: ClientWatch | None,
        model_wait_s: float = 0.0,
        *,
        probe: bool = False,
    ) -> InferenceResult: ...

    async def generate(
        self, request: ValidGenerationRequest, watch: ClientWatch | None, *, probe: bool = False
    ) -> AdmittedGeneration: ...


async def exercise(service: Door, model: str, handler: ModelHandler, *, probe_only: bool) -> None:
    """A model's warm-up requests (each too big for this device skipped), or its
    probe: one tiny request. What they are is the model's (`exercises`)."""
    planned = handler.exercises(probe_only)
    for batch in planned.batches:
        with contextlib.suppress(OutOfMemory, ExceedsDevice):  # too big here
            served = await service.serving(model, planned.capability, probe=True)
            await service.one_shot(model, served, batch, None, probe=True)
    params = SamplingParams(max_tokens=PROBE_TOKENS, temperature=0.0, prefix_cache=False)
    for prompt in planned.prompts:
        with contextlib.suppress(OutOfMemory, ExceedsDevice):
            request = ValidGenerationRequest(model, prompt, params)
            generation = await service.generate(request, None, probe=True)
            try:
                async for _ in generation.deltas():
                    pass
                await generation.outcome()
            finally:
                generation.close()


async def probe_loop(service: Door) -> None:
    """The readiness check's tiny real inference on a loaded model, after each
    `health_interval` in which no job completed and none runs (`Health.needs_probe`), so
    a wedged worker shows. With every model unloaded (the user's choice) nothing can
    wedge."""
    interval = service.settings.health_interval
    while True:
        await asyncio.sleep(interval)
        if not service.health.needs_probe(interval):
            continue
        loaded = [n for n, e in service.registry.entries.items() if e.state == "ready"]
        if not loaded:
            service.health.alive()
            continue
        with contextlib.suppress(VramgateError):
            await exercise(service, loaded[0], service.registry.get(loaded[0]), probe_only=True)
