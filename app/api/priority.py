"""Each HTTP request's class (app.core.priority) opened where it enters: the header a
client that can set no body field sends (`X-Vramgate-Priority`), and the classes the
config's `priorities` table gives its caller (`"caller:<User-Agent glob>"`) and route.
The route fills in its body's own field (OpenAI's `service_tier`, vLLM's `priority`)
with `app.core.priority.say`."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from app.core.priority import Asked, asking, configured
from app.sched.priority import parse

HEADER = b"x-vramgate-priority"
CALLER = "caller:"  # a pattern of the table that reads the User-Agent


def callers(table: Mapping[str, str]) -> dict[str, str]:
    """The table's `caller:` patterns, keyed by the User-Agent glob each names."""
    return {k.removeprefix(CALLER): v for k, v in table.items() if k.startswith(CALLER)}


class PriorityLayer:
    def __init__(self, app: ASGIApp, table: Mapping[str, str]) -> None:
        self.app = app
        self.table = {k: v for k, v in table.items() if not k.startswith(CALLER)}
        self.callers = callers(table)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        said = next((v for k, v in scope["headers"] if k == HEADER), None)
        own = parse(said.decode("latin-1")) if said is not None else None
        routed = configured(scope["path"], self.table) if self.table else None
        called = None
        if self.callers:
            agent = next((v for k, v in scope["headers"] if k == b"user-agent"), b"")
            called = configured(agent.decode("latin-1"), self.callers)
        with asking(Asked(own=own, caller=called, routed=routed)):
            await self.app(scope, receive, send)
