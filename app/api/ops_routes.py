"""Operations routes: /health, /status, /metrics."""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.core.service import InferenceService
from app.core.snapshot import status_document

router = APIRouter(tags=["ops"])


def _service(request: Request) -> InferenceService:
    return request.app.state.service


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 when ready to serve; 503 while loading, after a device failure, or when wedged."""
    service = _service(request)
    ready = service.ready
    body = {"live": True, "ready": ready, "state": service.state.phase}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/status")
async def status(request: Request) -> dict[str, Any]:
    service = _service(request)
    return status_document(
        service.view(),
        service.device.describe(),
        service.lifecycle.describe(),
        service.book.snapshot(),
        service.metrics,
        service.lifecycle.gave_back_view(),
    )


@router.get(
    "/metrics", responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}}
)
async def metrics(request: Request) -> Response:
    """Prometheus text format."""

    service = _service(request)
    m = service.metrics
    service.view().set_gauges(m, service.book.snapshot())
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/history")
async def history(request: Request) -> dict[str, Any]:
    """The last minutes of once-a-second samples, and the recent rejections."""
    return _service(request).history.as_dict()


@router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
async def dashboard() -> HTMLResponse:
    page = resources.files("app.api").joinpath("dashboard.html").read_text(encoding="utf-8")
    return HTMLResponse(page, headers={"Content-Security-Policy": DASHBOARD_CSP})


# The page may talk to its own server only: no CDN, no other host.
DASHBOARD_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'"
)
