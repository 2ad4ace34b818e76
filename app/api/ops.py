"""Operations routes: /health, /status, /metrics, the dashboard, and Ollama's `/`."""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.api.intake import (
    fleet_of,
)

router = APIRouter(tags=["ops"])


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 when ready to serve; 503 while loading, after a device failure, or when wedged."""
    fleet = fleet_of(request)
    ready = fleet.ready
    body = {"live": True, "ready": ready, "state": fleet.phase}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def running() -> PlainTextResponse:
    """Ollama's answer at its root: the `ollama` CLI's heartbeat (HEAD /) before each
    command, and what programs that look for an Ollama server read."""
    return PlainTextResponse("Ollama is running")


@router.get("/status")
async def status(request: Request) -> dict[str, Any]:
    return fleet_of(request).status()


@router.get(
    "/metrics", responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}}
)
async def metrics(request: Request) -> Response:
    """Prometheus text format."""

    fleet = fleet_of(request)
    fleet.set_gauges()
    return Response(generate_latest(fleet.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/history")
async def history(request: Request) -> dict[str, Any]:
    """The last minutes of once-a-second samples, and the recent rejections."""
    return fleet_of(request).history.as_dict()


@router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
async def dashboard() -> HTMLResponse:
    page = resources.files("app.api").joinpath("dashboard.html").read_text(encoding="utf-8")
    return HTMLResponse(page, headers={"Content-Security-Policy": DASHBOARD_CSP})


# The page may talk to its own server only: no CDN, no other host.
DASHBOARD_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'"
)
