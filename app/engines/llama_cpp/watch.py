"""A runner's work watched from outside, through its `/slots` (app.engines.llama_cpp.slots):
whether it moves, and when it has let go of a request.

Liveness by progress: a runner is alive while its work moves (a slot's prompt or answer
grew, a request began or ended), not while an HTTP thread answers: those answer
`/health` while the loop that computes hangs. `/slots` is answered by that loop between
two batches, so a look that gets no answer, or two looks alike while requests run, is
no beat, and the watchdog ends a runner that gives none for `run_timeout`
(`LlamaRunnerModel.stalled`).

Letting go: a request our side ends early (its client left, a deadline, a drain, an
unload) is cancelled in llama.cpp only once its HTTP thread notices the closed
connection (it polls the socket every second) and its loop next turns (after the batch
in flight). Until then the slot holds the request's cells, so they come back to the gate
only when a look shows no slot holding it (`let_go`): a request admitted into cells
still held would overflow the unified pool, and llama.cpp then fails every running
request ("Context size has been exceeded.")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from app.engines.llama_cpp.client import RunnerAnswer, RunnerClient
from app.engines.llama_cpp.slots import SlotsView, tags

log = logging.getLogger("vramgate.llama_cpp")

LET_GO_POLL_S = 0.05  # between two looks while a cancelled request's slot still holds it


class RunnerWatch:
    """The looks at one runner's slots, for every request of it: each look that shows
    its work moved calls `beat`."""

    def __init__(self, client: RunnerClient, beat: Callable[[], None], limit_s: float) -> None:
        """`limit_s`: the longest a cancelled request may take to be let go while the
        runner answers (the model's `run_timeout`)."""
        self._client = client
        self._beat = beat
        self._limit_s = limit_s
        self._seen: SlotsView | None = None
        self.tags = tags()  # each request's tag (app.engines.llama_cpp.slots.TAG_FIELD)

    async def look(self) -> SlotsView | None:
        """The runner's busy slots now, a beat if its work moved since the last look
        (anyone's); None when it gives no answer within the client's timeout, or is gone."""
        try:
            view = SlotsView.of(await self._client.call("GET", "/slots"))
        except (OSError, asyncio.IncompleteReadError, ValueError, RunnerAnswer):
            return None  # TimeoutError among them: a loop that does not turn
        if view.moved_since(self._seen):
            self._beat()
        self._seen = view
        return view

    async def let_go(self, tag: int) -> float | None:
        """Wait until no slot holds the request tagged `tag` (its connection closed
        already); returns the seconds it took. None: the runner did not let go within
        `limit_s`, or stopped answering: the caller ends the runner, which frees all."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while loop.time() - started < self._limit_s:
            view = await self.look()
            if view is None:
                return None
            if not view.holds(tag):
                return loop.time() - started
            await asyncio.sleep(LET_GO_POLL_S)
        return None
