"""A text to speak in parts: split at sentence ends, each part a request of its own, run
a few at a time (those queued together share a forward) and handed back in order.

Why parts: a VITS forward speaks its whole row at once, so a 4,096-character input alone
would be minutes of audio computed before the first sample is sent, and one bucket of
thousands of tokens; in parts, the first sentence is heard once it is spoken, the parts
batch with each other and with other callers' requests, and each part is priced in a
bucket that recurs."""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import AsyncIterator, Iterator

from app.core.fleet.fleet import Fleet
from app.core.requests import ValidSpeech
from app.core.watch import ClientWatch
from app.core.work import InferenceResult

PART_CHARS = 200  # a part's most characters (sentences are joined up to this)
AHEAD = 4  # parts queued at once: they may share a forward
# a sentence ends at . ! ? … before white space, at CJK's 。！？ (written without), or at
# a line break
SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|(?<=[。！？])\s*|\s*\n\s*")


def split_parts(text: str, limit: int = PART_CHARS) -> list[str]:
    """`text`'s sentences, the first alone (it is heard soonest), the rest joined up to
    `limit` characters; a sentence longer than that is cut at its last spaces before it
    (or at `limit`, where it has none)."""
    pieces = [cut for s in SENTENCE_END.split(text) if s.strip() for cut in _cut(s.strip(), limit)]
    if not pieces:
        return [text]
    parts = [pieces[0]]
    for piece in pieces[1:]:
        if len(parts) > 1 and len(parts[-1]) + 1 + len(piece) <= limit:
            parts[-1] += " " + piece
        else:
            parts.append(piece)
    return parts


def _cut(sentence: str, limit: int) -> Iterator[str]:
    while len(sentence) > limit:
        at = sentence.rfind(" ", 0, limit + 1)
        at = at if at > 0 else limit
        yield sentence[:at].strip()
        sentence = sentence[at:].strip()
    if sentence:
        yield sentence


class SpokenParts:
    """One request's parts, run through the fleet `AHEAD` at a time, their results in
    order. Whoever makes one must `close()` it: parts still queued leave the queue then
    (a part already on the device finishes; its result is dropped)."""

    def __init__(self, fleet: Fleet, parts: list[ValidSpeech]) -> None:
        self._fleet = fleet
        self._waiting = deque(parts)
        self._running: deque[asyncio.Future[InferenceResult]] = deque()

    async def first(self, watch: ClientWatch) -> InferenceResult:
        """The first part's result (its refusal raised here, before any answer), the
        next parts queued beside it. `watch`: the client leaving while it waits."""
        head = asyncio.ensure_future(self._fleet.run(self._waiting.popleft(), watch))
        self._running.append(head)
        self._top_up()
        return await head

    async def rest(self, first: InferenceResult) -> AsyncIterator[InferenceResult]:
        """`first` (already popped), then every other part's result in order."""
        self._running.popleft()
        yield first
        while self._running:
            result = await self._running[0]
            self._running.popleft()
            self._top_up()
            yield result

    def _top_up(self) -> None:
        while self._waiting and len(self._running) < AHEAD:
            part = self._waiting.popleft()
            self._running.append(asyncio.ensure_future(self._fleet.run(part, None)))

    async def close(self) -> None:
        """Cancel what has not come back: queued parts leave the queue."""
        self._waiting.clear()
        running, self._running = list(self._running), deque()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
