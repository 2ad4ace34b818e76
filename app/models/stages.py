"""How a model's work runs: the engine says, the core never asks.

A request passes three stages: `prepare` (tokenise or decode, bucket), `start` (the work
that holds device memory; its future resolves when the device is done, with what it
measured) and `finish` (shape the output). Where each runs is the engine's choice, made
through the `Pools` it is handed (the executor's, app.devices.executor): an in-process
engine (torch, the simulated one) mixes in `InThreads`, which runs preprocess on the CPU
pool (or on the loop when it is short), forward and generate on the device threads, and
postprocess on the loop (or the CPU pool); an engine whose work runs in another process
(a llama.cpp runner) awaits it on the event loop itself, measured by `elsewhere`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from app.devices.executor import Measurement

if TYPE_CHECKING:
    from app.models.decoding import DecodeResult, Prompt, SamplingParams, TokenStream
    from app.models.prepared import Prepared

T = TypeVar("T")
# a request's device work, once started: resolves with its output and what it measured
Launched = asyncio.Future[tuple[Any, Measurement]]
INLINE_PREPROCESS_CHARS = 4096  # texts up to this long are tokenised on the loop


class Pools(Protocol):
    """Where a stage may run: the CPU pool for work that would stall the event loop, the
    device threads (a stream's own pool for a generation) for work that holds device
    memory, measured."""

    async def run_cpu(self, fn: Callable[..., T], *args: Any) -> T: ...

    def submit_device(
        self, fn: Callable[..., T], *args: Any, stream: bool = False
    ) -> asyncio.Future[tuple[T, Measurement]]: ...


async def elsewhere(work: Awaitable[T]) -> tuple[T, Measurement]:
    """Work another process does, awaited on the loop: it holds none of our device
    memory (a runner's is counted by its pid), so only its time is measured."""
    started = time.perf_counter()
    result = await work
    return result, Measurement(0, time.perf_counter() - started, alone=False)


class InThreads:
    """The stages of an in-process engine's model, from its preprocess / forward /
    postprocess (one-shot) or prepare_generation / generate (a generator)."""

    preprocess_on_loop = True  # False: never on the loop, however short (decoding audio)
    postprocess_on_loop = True  # False: on the CPU pool (heavy encoding: PNG, timed text)

    # the hooks it runs, each the handler's own (see app.models.kinds)
    preprocess: Callable[[list[Any]], Prepared]
    forward: Callable[[Prepared], Any]
    postprocess: Callable[[Any], Any]
    prepare_generation: Callable[[Prompt, SamplingParams, int], Prepared]
    generate: Callable[[Prepared, TokenStream], DecodeResult]

    async def prepare_inputs(self, inputs: list[Any], pools: Pools) -> Prepared:
        if (
            self.preprocess_on_loop
            and sum(len(item) for item in inputs) <= INLINE_PREPROCESS_CHARS
            and all(isinstance(item, str) for item in inputs)
        ):  # tokenised on the loop: a thread hop costs more than the work
            return self.preprocess(inputs)
        # large inputs and every image on the CPU pool, so the loop stays responsive
        return await pools.run_cpu(self.preprocess, inputs)

    async def prepare_prompt(
        self, prompt: Prompt, params: SamplingParams, default_max_tokens: int, pools: Pools
    ) -> Prepared:
        return await pools.run_cpu(self.prepare_generation, prompt, params, default_max_tokens)

    def start(self, prepared: Prepared, stream: TokenStream | None, pools: Pools) -> Launched:
        if stream is None:
            return pools.submit_device(self.forward, prepared)
        return pools.submit_device(self.generate, prepared, stream, stream=True)

    async def finish(self, raw: Any, pools: Pools) -> Any:
        if self.postprocess_on_loop:
            return self.postprocess(raw)
        return await pools.run_cpu(self.postprocess, raw)
