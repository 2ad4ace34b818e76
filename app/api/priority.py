"""Each HTTP request's class (app.core.priority) opened where it enters: the header a
client that can set no body field sends (`X-Vramgate-Priority`), and the class the
config's `priorities` table gives its route. The route fills in its body's own field
(OpenAI's `service_tier`, vLLM's `priority`) with `app.core.priority.say`."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from app.core.priority import Asked, asking, configured
from app.sched.priority import parse

HEADER = b"x-vramgate-priority"


class PriorityLayer:
    def __init__(self, app: ASGIApp, table: Mapping[str, str]) -> None:
        self.app = app
        self.table = dict(table)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        said = next((v for k, v in scope["headers"] if k == HEADER), None)
        own = parse(said.decode("latin-1")) if said is not None else None
        routed = configured(scope["path"], self.table) if self.table else None
        with asking(Asked(own=own, routed=routed)):
            await self.app(scope, receive, send)
