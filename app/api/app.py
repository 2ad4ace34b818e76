"""The FastAPI application: built from Settings, with its seams injectable for tests."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from app import __version__
from app.api import admin, ops
from app.api.a1111 import routes as a1111_routes
from app.api.a1111.jobs import A1111Jobs
from app.api.anthropic import routes as anthropic_routes
from app.api.audio import routes as audio_routes
from app.api.audio import speech as speech_routes
from app.api.errors import (
    ANTHROPIC_ERROR_RESPONSES,
    ERROR_RESPONSES,
    OLLAMA_ERROR_RESPONSES,
    install_error_handlers,
)
from app.api.guard import RequestGuard
from app.api.hot import HotRoutes
from app.api.images import files as images_files
from app.api.images import routes as images_routes
from app.api.intake import request_schemas
from app.api.ollama import routes as ollama_routes
from app.api.openai import routes as openai_routes
from app.api.priority import PriorityLayer
from app.api.rerank import routes as rerank_routes
from app.api.responses import routes as responses_routes
from app.api.responses.store import ResponseStore
from app.api.vision import routes as vision_routes
from app.config import ollama_names
from app.config.settings import ConfigSource, Settings
from app.core.fleet.fleet import Fleet, build_fleet
from app.devices.base import Device
from app.process.logconfig import set_snapshot_provider

log = logging.getLogger("vramgate.app")


def build_core(
    settings: Settings,
    device: Device | None = None,
    on_fatal: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.monotonic,
) -> Fleet:
    """The server's core: one service per device (`device`: that one alone, for tests)."""
    from app.devices.choose import make_devices  # torch's: imported once a server starts

    devices = [device] if device is not None else make_devices(settings)
    return build_fleet(settings, devices, on_fatal, clock)


def create_app(
    settings: Settings,
    *,
    device: Device | None = None,
    on_fatal: Callable[[], None] = lambda: None,
    on_shutdown_request: Callable[[], None] = lambda: None,
    hot_routes: bool = True,
    models_source: ConfigSource | None = None,
) -> FastAPI:
    """`on_fatal` is called once after a fatal device error, `on_shutdown_request` when
    POST /admin/shutdown asks the process to stop (the CLI stops uvicorn for both).
    `hot_routes=False` serves the inference routes through FastAPI's own layers too.
    `models_source`: the config the server reads its model list from again (POST
    /admin/models/reread) and pulls into (POST /admin/models/pull)."""

    ollama_names.use(settings.ollama_names)  # the config's names over the shipped ones
    fleet = build_core(settings, device, on_fatal)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for lane in fleet.lanes:
            log.info(
                "device %s (%s); %d slot(s); torch threads %d",
                lane.device.id,
                lane.device.name,
                lane.executor.slots,
                lane.executor.torch_threads,
            )
        set_snapshot_provider(fleet.memory_line)
        await fleet.start()
        try:
            yield
        finally:
            await fleet.stop()
            set_snapshot_provider(None)

    app = VramgateApp(
        outer=_outer_layers(settings, hot_routes),
        title="vramgate",
        version=__version__,
        summary="Local inference that admits work by measured VRAM bytes.",
        lifespan=lifespan,
    )
    app.state.fleet = fleet
    app.state.request_shutdown = on_shutdown_request
    app.state.models_source = models_source
    app.state.pulling = None  # the pull under way (one at a time)
    app.state.responses = ResponseStore(  # the Responses API's stored answers
        settings.resolved_data_dir / "responses",
        settings.max_stored_responses,
        int(settings.max_stored_response_bytes),
    )
    app.state.image_files = images_files.ImageFiles(settings.image_url_ttl_s)  # url answers
    app.state.a1111 = A1111Jobs()  # AUTOMATIC1111's checkpoint and current job
    routers = (
        openai_routes.router,
        vision_routes.router,
        ops.router,
        admin.router,
        ollama_routes.router,
        rerank_routes.router,
        responses_routes.router,
        images_routes.router,
        images_files.router,
        a1111_routes.router,
        audio_routes.router,
        speech_routes.router,
    )
    for router in routers:
        errors = OLLAMA_ERROR_RESPONSES if router is ollama_routes.router else ERROR_RESPONSES
        app.include_router(router, responses=errors)
    app.include_router(anthropic_routes.router, responses=ANTHROPIC_ERROR_RESPONSES)
    install_error_handlers(app)
    return app


def _outer_layers(settings: Settings, hot_routes: bool) -> Callable[[ASGIApp], ASGIApp]:
    def wrap(inner: ASGIApp) -> ASGIApp:
        if hot_routes:
            inner = HotRoutes(inner, openai_routes.HOT_ROUTES)
        return RequestGuard(PriorityLayer(inner, settings.priorities), settings)

    return wrap


class VramgateApp(FastAPI):
    """FastAPI inside our own outer layers: every request meets the guard first, then the
    hot routes (app.api.hot), and only then FastAPI's own middleware stack."""

    def __init__(self, *, outer: Callable[[ASGIApp], ASGIApp], **kwargs: Any) -> None:
        self._outer = outer
        self._hot = frozenset(openai_routes.HOT_ROUTES)
        super().__init__(**kwargs)

    def build_middleware_stack(self) -> ASGIApp:
        return self._outer(super().build_middleware_stack())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The hot routes skip FastAPI's per-request check for an OpenTelemetry provider
        (a tenth of the event loop's time with a model that does no work); vramgate
        configures none, and every other route still passes through it."""
        if scope["type"] == "http" and (scope["method"], scope["path"]) in self._hot:
            if self.root_path:
                scope["root_path"] = self.root_path
            await Starlette.__call__(self, scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def openapi(self) -> dict[str, Any]:
        """FastAPI's document, with the request bodies our routes validate themselves."""
        if self.openapi_schema is None:
            document = super().openapi()
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(openai_routes.openai_schemas())
            schemas.update(anthropic_routes.anthropic_schemas())
            schemas.update(responses_routes.responses_schemas())
            schemas.update(request_schemas((speech_routes.SpeechRequest,)))
        return super().openapi()
