"""A streamed request whose model loads first is told how the load goes, before its
first token: a client with a short read timeout (or a person watching) sees that
something happens during a cold load of many seconds.

Admission begins as for any request; while it has not answered and the model is not
loading (a warm model, a queue's wait) nothing changes: the request's errors are still
its HTTP status. Once the model is seen loading, the answer starts (200, streamed) and
carries the load's progress every `EVERY_S` until admission answers; then the tokens
follow, or the error as the stream's error. Each API says progress in a shape its
clients pass over: Ollama's NDJSON an empty message with a `status` (as its pull says
its steps), OpenAI's server-sent events (chat, completions, Responses) a comment line
(`: ...`, which every SSE parser, the `openai` client's included, skips), Anthropic's
that comment and a `ping` event (its own keep-alive, which its clients skip).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from app.core.fleet.fleet import Fleet
from app.core.lifecycle.load_watch import said
from app.errors import VramgateError

T = TypeVar("T")

POLL_S = 0.25  # how often a waiting admission looks whether its model began loading
EVERY_S = 1.0  # a streamed load's progress is said this often


@dataclass
class Admission(Generic[T]):
    """An admission under way: `loading` once its model was seen loading before it
    answered (the answer streams the load first)."""

    task: asyncio.Future[T]
    loading: bool


async def admit_watching(fleet: Fleet, model: str, admit: Awaitable[T]) -> Admission[T]:
    """`admit` begun; back when it has answered, or once `model` is seen loading."""
    task = asyncio.ensure_future(admit)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=POLL_S)
            if done:
                return Admission(task, False)
            if fleet.loading(model) is not None:
                return Admission(task, True)
    except BaseException:  # the request itself was cancelled: so is its admission
        task.cancel()
        raise


async def progress(fleet: Fleet, model: str, task: asyncio.Future[Any]) -> AsyncIterator[str]:
    """The load's progress in words (app.core.lifecycle.load_watch.said), now and every
    `EVERY_S`, until the admission answers."""
    while not task.done():
        view = fleet.loading(model)
        if view is not None:
            yield f"loading {model}: {said(view)}"
        await asyncio.wait({task}, timeout=EVERY_S)


def drop(task: asyncio.Future[Any], close: Any) -> None:
    """The answer ended before it took what admission gave (its client left): the
    admission is cancelled, or what it admitted closed (`close(result)`)."""
    if not task.done():
        task.cancel()
    elif not task.cancelled() and task.exception() is None:
        close(task.result())


async def after_load(
    fleet: Fleet,
    model: str,
    admission: asyncio.Future[list[T]],
    say: Callable[[str], bytes],
    refuse: Callable[[VramgateError], bytes],
    close: Callable[[T], object],
    answer: Callable[[list[T]], AsyncIterator[bytes]],
) -> AsyncIterator[bytes]:
    """A streamed answer that begins while its model loads: the load's progress as `say`
    words it, then `answer`'s lines from what admission gave, or `refuse`'s error line.
    A client that left before the answer took it leaves nothing admitted: `close` each."""
    taken = False
    try:
        async for words in progress(fleet, model, admission):
            yield say(words)
        try:
            admitted = await admission
        except VramgateError as exc:
            yield refuse(exc)
            return
        taken = True
    finally:
        if not taken:  # the client left meanwhile: nothing admitted stays
            drop(admission, lambda results: [close(r) for r in results])
    async for line in answer(admitted):
        yield line
