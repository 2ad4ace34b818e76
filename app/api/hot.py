"""Hot routes: the inference routes served as plain ASGI, past FastAPI's per-request layers.

Measured on the embeddings route with a model that does no work, FastAPI's exception
middlewares, router and endpoint wrapper cost about half of the event loop's time per
request. The routes that carry the load are therefore dispatched here, in one dict
lookup, to the same endpoint functions the FastAPI routes call; the FastAPI routes stay
for everything else they give (the OpenAPI document, a path with the framework's layers
for `create_app(hot_routes=False)`). The guards wrap this middleware, so the hot path is
guarded exactly like every other route.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.errors import counted, error_response, from_http
from app.errors import InternalError, VramgateError

log = logging.getLogger("vramgate.api")

Endpoint = Callable[[Request], Awaitable[Response]]


class HotRoutes:
    def __init__(self, app: ASGIApp, routes: Mapping[tuple[str, str], Endpoint]) -> None:
        self.app = app
        self.routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = None
        if scope["type"] == "http":
            endpoint = self.routes.get((scope["method"], scope["path"]))
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await endpoint(Request(scope, receive, send))
        except VramgateError as exc:
            response = error_response(counted(scope, exc))
        except HTTPException as exc:  # the body limit, raised while the body streams in
            response = error_response(counted(scope, from_http(exc)))
        except Exception as exc:
            log.error("unhandled error on %s %s", scope["method"], scope["path"], exc_info=exc)
            response = error_response(counted(scope, InternalError("internal server error")))
        await response(scope, receive, send)
